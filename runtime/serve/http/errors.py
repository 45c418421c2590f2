"""Errors as the HTTP API reports them: OpenAI's error JSON with the status that fits the typed error.

400 bad input (malformed JSON, wrong types, bad sampling, a prompt longer than the context), 401 a
missing or wrong API key, 404 an unknown path, 413 a body over the limit, 429 (with Retry-After) a full
queue, 503 while loading or closing, 504 a request timeout; anything else is a 500 and is logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from runtime.errors import (
    BadInput,
    BadModelOutput,
    Busy,
    Conflict,
    ContextOverflow,
    InvalidSampling,
    NotFound,
    TimedOut,
    TurnstileError,
    Unavailable,
)
from runtime.log import get_logger
from runtime.serve.http.chat.schema import ErrorBody, ErrorResponse

__all__ = ["RETRY_AFTER_SECONDS", "ApiError", "is_anthropic", "to_api_error"]

log = get_logger(__name__)

RETRY_AFTER_SECONDS = 1
ANTHROPIC_PREFIX = "/v1/messages"
# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def is_anthropic(path: str) -> bool:
    """Whether `path` is one of the Anthropic Messages API's (its errors take Anthropic's shape)."""
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


@dataclass
class ApiError(TurnstileError):
    """Raised inside the HTTP app to answer with an error: status, OpenAI error type and code, headers."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"

    def body(self) -> bytes:
        err = ErrorBody(message=self.message, type=self.type, code=self.code, param=self.param)
        return msgspec.json.encode(ErrorResponse(error=err))

    def anthropic_type(self) -> str:
        return _ANTHROPIC_TYPES.get(self.status, "api_error")

    def anthropic_body(self) -> bytes:
        """Anthropic's error JSON: {"type": "error", "error": {"type": ..., "message": ...}}."""
        return msgspec.json.encode({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}})

    @classmethod
    def bad_request(cls, message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
        return cls(400, message, param=param, code=code)

    @classmethod
    def unavailable(cls, message: str) -> ApiError:
        return cls(503, message, type="unavailable_error", code="unavailable")


def to_api_error(exc: BaseException) -> ApiError:
    """The API error for an exception raised while serving a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, msgspec.ValidationError):
        if isinstance(exc.__cause__, TurnstileError):  # a check in a Struct's __post_init__ (bad sampling, …)
            return to_api_error(exc.__cause__)
        return ApiError.bad_request(f"invalid request body: {exc}")
    if isinstance(exc, msgspec.DecodeError):
        return ApiError.bad_request(f"malformed JSON: {exc}")
    if isinstance(exc, BadModelOutput):  # the model's output, not the request, is at fault
        log.warning("serve.bad_model_output", error=type(exc).__name__, message=str(exc))
        return ApiError(500, str(exc), type="server_error", code="invalid_model_output")
    if isinstance(exc, ContextOverflow):
        return ApiError.bad_request(str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, InvalidSampling):
        return ApiError.bad_request(str(exc), param=exc.field, code="invalid_value")
    if isinstance(exc, BadInput | ValueError):  # a ValueError from a decoder, a conversion or a check
        return ApiError.bad_request(str(exc), code="invalid_value")
    if isinstance(exc, Busy):
        return ApiError(
            429,
            f"the server is busy: {exc}",
            type="rate_limit_error",
            code="queue_full",
            headers={"retry-after": str(RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, Unavailable):
        return ApiError.unavailable(str(exc))
    if isinstance(exc, TimedOut):
        return ApiError(504, str(exc), type="timeout_error", code="request_timeout")
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc), type="not_found_error", code="session_not_found")
    if isinstance(exc, Conflict):
        return ApiError(409, str(exc), type="conflict_error", code="session_conflict")
    if isinstance(exc, TurnstileError):
        log.warning("serve.error", error=type(exc).__name__, message=str(exc))
        return ApiError(500, str(exc), type="server_error", code=type(exc).__name__)
    log.error("serve.unexpected_error", error=type(exc).__name__, message=str(exc), exc_info=exc)
    return ApiError(500, "internal server error", type="server_error", code="internal_error")
