"""The runtime's typed errors. Every error turnstile raises on purpose derives from `TurnstileError`."""

from __future__ import annotations

from typing import Any

from sessions.errors import InvalidConfig, TurnstileError

__all__ = [
    "ContextOverflow",
    "DecodeError",
    "InvalidConfig",
    "InvalidRequest",
    "InvalidTool",
    "InvalidToolArguments",
    "MaxStepsExceeded",
    "ModelLoadError",
    "QueueFull",
    "ReplyMismatch",
    "RequestTimeout",
    "ResponseFormatError",
    "RuntimeClosed",
    "ToolCallParseError",
    "TurnstileError",
    "UnsupportedSchema",
]


class ModelLoadError(TurnstileError):
    """Raised when a model file is missing, unreadable, not a GGUF file or rejected by llama.cpp."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot load model {path!r}: {reason}")
        self.path = path
        self.reason = reason


class DecodeError(TurnstileError):
    """Raised when llama_decode fails: 1 no KV slot, 2 aborted, -1 bad batch, < -1 fatal."""

    def __init__(self, code: int, detail: str = "") -> None:
        meaning = {1: "no KV slot for the batch", 2: "aborted", -1: "invalid batch"}.get(
            code, "fatal error" if code < -1 else "unknown error"
        )
        super().__init__(f"llama_decode returned {code} ({meaning}){': ' + detail if detail else ''}")
        self.code = code


class ContextOverflow(TurnstileError):
    """Raised before anything changes when a prompt (plus the room asked for) does not fit the context."""

    def __init__(self, n_prompt: int, n_ctx: int, room: int = 0) -> None:
        need = f"{n_prompt} prompt tokens" + (f" + {room} to generate" if room else "")
        super().__init__(f"{need} do not fit a context of {n_ctx} tokens")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx
        self.room = room


class QueueFull(TurnstileError):
    """Raised at once when a request arrives while `max_queued` requests are already waiting."""


class InvalidRequest(TurnstileError, ValueError):
    """Raised before anything is queued when a request argument has the wrong type or value."""


class RequestTimeout(TurnstileError, TimeoutError):
    """Raised when a request's `timeout` passes before it finished; its session is unchanged."""


class RuntimeClosed(TurnstileError):
    """Raised for requests made to, or still queued in, a runtime that is closing or closed."""


class InvalidTool(TurnstileError, ValueError):
    """Raised when a tool definition, a function given as a tool, or a `tool_choice` is not usable."""


class InvalidToolArguments(TurnstileError, ValueError):
    """Raised when a tool call's arguments do not validate against the tool's parameters schema."""

    def __init__(self, tool: str, reason: str) -> None:
        super().__init__(f"invalid arguments for tool {tool!r}: {reason}")
        self.tool = tool
        self.reason = reason


class ToolCallParseError(TurnstileError):
    """Raised when model output opens a tool call that is malformed, names an unknown tool or has bad arguments."""

    def __init__(self, reason: str, text: str = "") -> None:
        super().__init__(f"cannot parse the tool call: {reason}")
        self.reason = reason
        self.text = text
class UnsupportedSchema(TurnstileError, ValueError):
    """Raised when a JSON schema is one llama.cpp's schema-to-grammar converter rejects (or has a remote $ref)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ResponseFormatError(TurnstileError, TypeError):
    """Raised when a response format is not a msgspec Struct, dataclass or TypedDict type, a schema dict or "json"."""


class ReplyMismatch(TurnstileError, ValueError):
    """Raised when a reply's text is not JSON or does not match the response format's schema or type."""


class MaxStepsExceeded(TurnstileError):
    """Raised by `Runtime.run` when the model still calls tools after `max_steps` calls; carries the steps."""

    def __init__(self, max_steps: int, steps: tuple[Any, ...], last: Any) -> None:
        super().__init__(f"the model still calls tools after {max_steps} steps")
        self.max_steps = max_steps
        self.steps = steps  # the `Step`s taken
        self.last = last  # the last `Reply` (its tool calls were not run)
