"""The skeleton every POST endpoint of the HTTP API shares, as plain ASGI: the body read with its size checked,
the request accepted (parsed, its tenant applied, the Runtime required) or refused with an error response,
then its work run while the connection is watched, an error after that sent in the dialect's shape, and a
client that left counted.

The body is read with its size checked (Content-Length first, then the bytes as they come: 413). While the
reply is awaited or streamed, a watcher reads the connection: a disconnect cancels the work, which withdraws
the request from the Runtime (queued: removed; running: stopped at the next token) and nothing is committed.
A dialect writes only what differs: how a body becomes a `Work` (`Endpoint.accept`), the work itself, and
its error shape (`Endpoint.anthropic`).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol, cast

import anyio

from runtime.api import Runtime
from runtime.errors import TurnstileError
from runtime.log import get_logger
from runtime.loop.stream import Piece
from runtime.reply import Reply, Started
from runtime.serve.asgi import Receive, Scope, Send, header
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.state import ServeState
from runtime.serve.http.watch import Phase, run_watched

__all__ = ["ClientGone", "CompleteWork", "Endpoint", "Work", "read_body", "send_bytes", "send_error"]

log = get_logger(__name__)

_JSON = (b"content-type", b"application/json")


class ClientGone(TurnstileError):
    """The client disconnected before the request body was read."""


async def send_bytes(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    raw = [_JSON, (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, err: ApiError, *, anthropic: bool = False) -> None:
    """The error response, in OpenAI's shape or (`anthropic`) Anthropic's."""
    await send_bytes(send, err.status, err.anthropic_body() if anthropic else err.body(), err.headers)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body, at most `limit` bytes (413 otherwise, judged by Content-Length and by what arrives)."""
    declared = header(scope, b"content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ApiError.bad_request("invalid Content-Length header")
        if int(declared) > limit:
            raise ApiError(
                413, f"request body of {int(declared)} bytes is over the limit of {limit} bytes", code="body_too_large"
            )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body = message.get("body", b"")
        size += len(body)
        if size > limit:
            raise ApiError(413, f"request body is over the limit of {limit} bytes", code="body_too_large")
        chunks.append(body)
        if not message.get("more_body", False):
            return b"".join(chunks)


class Work(ABC):
    """One accepted request: what it does while its client is watched, and what is left to do afterwards."""

    @abstractmethod
    async def run(self, send: Send, phase: Phase) -> None:
        """Answer the request (set `phase.ending` before the last bytes of a whole response)."""

    async def close(self) -> None:  # noqa: B027 (most works hold nothing)
        """After the work, whatever happened (shielded from cancellation): release what it holds."""

    @abstractmethod
    def gone(self) -> tuple[str, dict[str, Any]]:
        """The log event and its fields for a client that left before the reply."""


class TurnCall(Protocol):
    """What a dialect decoded from a turn request (chat completions' `Call`, Messages' `MessagesCall`)."""

    messages: list[dict[str, Any]]
    kwargs: dict[str, Any]
    session_id: str | None
    stream: bool


class CompleteWork(Work):
    """A request the Runtime answers with `complete` (one body) or `complete_stream_started` (relayed as events,
    announced by a `Started` when the slot starts the turn, so a long prefill sends its first bytes at once); a
    dialect writes the body and the relay."""

    api: str | None = None  # the API named in the log line of a client that left
    prefill_progress: bool = False  # the stream has the prefill's `Progress` reports (llama-server's return_progress)

    def __init__(self, state: ServeState, rt: Runtime, call: TurnCall, timeout: float | None) -> None:
        self.state, self.rt, self.messages = state, rt, call.messages
        self.kwargs: Mapping[str, Any] = {
            **state.llama.sampling,
            **call.kwargs,
        }  # the server's defaults, then the call's
        self.session_id, self.stream, self.timeout = call.session_id, call.stream, timeout

    async def run(self, send: Send, phase: Phase) -> None:
        options = {"session_id": self.session_id, "timeout": self.timeout, **self.kwargs}
        if self.stream:
            items = cast(
                AsyncGenerator[Piece | Started | Reply, None],
                self.rt.complete_stream_started(self.messages, prefill_progress=self.prefill_progress, **options),
            )
            async with contextlib.aclosing(items):
                await self.relay(items, send, phase)
            return
        body = self.body(await self.rt.complete(self.messages, **options))
        phase.ending = True
        await send_bytes(send, 200, body)

    @abstractmethod
    def body(self, reply: Reply) -> bytes:
        """The whole response's body."""

    @abstractmethod
    async def relay(self, items: AsyncGenerator[Piece | Started | Reply, None], send: Send, phase: Phase) -> None:
        """Send the pieces, then the Reply, as the dialect's events (`runtime.serve.http.event_stream.relay`)."""

    def gone(self) -> tuple[str, dict[str, Any]]:
        fields: dict[str, Any] = {"session_id": self.session_id, "stream": self.stream}
        if self.api is not None:
            fields["api"] = self.api
        return "serve.client_gone", fields


class Endpoint(ABC):
    """A POST endpoint (an ASGI app for one route): the skeleton above; a dialect writes `accept`."""

    wants = "a JSON request"  # what an empty body is told it lacks
    anthropic = False  # errors in Anthropic's shape (else OpenAI's)

    def __init__(self, state: ServeState, *, max_body_bytes: int, request_timeout: float | None = None) -> None:
        self.state = state
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout

    @abstractmethod
    async def accept(self, body: bytes, scope: Scope) -> Work:
        """The request's work from its body (not empty), or an exception: an error response, nothing queued."""

    async def send_error(self, send: Send, exc: BaseException) -> None:
        await send_error(send, to_api_error(exc), anthropic=self.anthropic)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(scope, receive, self.max_body_bytes)
            if not body.strip():
                raise ApiError.bad_request(f"the request body is empty (want {self.wants})")
            work = await self.accept(body, scope)
        except ClientGone:
            return
        except Exception as e:  # before anything was queued: an error response
            await self.send_error(send, e)
            return

        async def fail(e: Exception) -> None:
            await self.send_error(send, e)

        try:
            phase = await run_watched(receive, lambda phase: work.run(send, phase), fail)
        finally:
            with anyio.CancelScope(shield=True):
                await work.close()
        if phase.gone:
            self.state.disconnects += 1
            event, fields = work.gone()
            log.info(event, **fields)
