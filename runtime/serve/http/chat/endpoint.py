"""POST /v1/chat/completions as a plain ASGI endpoint, so that it controls the body limit and notices a
client that leaves at any moment (while its request is queued, running, or being streamed).

The body is read with its size checked (Content-Length first, then the bytes as they come: 413). While
the reply is awaited or streamed, a watcher reads the connection: a disconnect cancels the request,
which withdraws it from the Runtime (queued: removed; running: stopped at the next token) and nothing is
committed. A streamed request waits for its first piece before the response starts, so errors raised
until then (a full queue, a prompt too long, a bad sampling value) get their own status code.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import cast

import msgspec

from runtime.api import Runtime
from runtime.errors import TurnstileError
from runtime.log import get_logger
from runtime.loop.stream import Piece
from runtime.reply import Reply
from runtime.serve.asgi import Receive, Scope, Send, header
from runtime.serve.http.chat import convert
from runtime.serve.http.chat.convert import Call
from runtime.serve.http.chat.schema import ChatRequest
from runtime.serve.http.chat.stream import ChunkWriter
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.event_stream import relay
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import tenant_of
from runtime.serve.http.watch import Phase, run_watched

__all__ = ["ChatEndpoint", "read_body", "send_bytes", "send_error"]

log = get_logger(__name__)

_JSON = (b"content-type", b"application/json")
_decoder = msgspec.json.Decoder(ChatRequest)


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


class ChatEndpoint:
    """The chat completions endpoint (an ASGI app for one route)."""

    def __init__(self, state: ServeState, *, max_body_bytes: int, request_timeout: float | None) -> None:
        self.state = state
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(scope, receive, self.max_body_bytes)
            if not body.strip():
                raise ApiError.bad_request("the request body is empty (want a JSON chat completion request)")
            call = convert.from_request(_decoder.decode(body), header(scope, b"x-session-id"))
            if call.session_id is not None:  # the client's id, in its tenant's namespace
                call.session_id = tenant_of(scope).session_id(call.session_id)
            rt = self.state.require()
        except ClientGone:
            return
        except Exception as e:  # before anything was queued: an error response
            await send_error(send, to_api_error(e))
            return

        async def work(phase: Phase) -> None:
            if call.stream:
                await self._stream(rt, call, send, phase)
            else:
                await self._complete(rt, call, send, phase)

        async def fail(e: Exception) -> None:
            await send_error(send, to_api_error(e))

        phase = await run_watched(receive, work, fail)
        if phase.gone:
            self.state.disconnects += 1
            log.info("serve.client_gone", session_id=call.session_id, stream=call.stream)

    async def _complete(self, rt: Runtime, call: Call, send: Send, phase: Phase) -> None:
        reply = await rt.complete(
            call.messages, session_id=call.session_id, timeout=self.request_timeout, **call.kwargs
        )
        body = msgspec.json.encode(convert.response(reply, request_id=self.state.next_id(), model=self.state.model))
        phase.ending = True
        await send_bytes(send, 200, body)

    async def _stream(self, rt: Runtime, call: Call, send: Send, phase: Phase) -> None:
        items = cast(
            AsyncGenerator[Piece | Reply, None],
            rt.complete_stream(call.messages, session_id=call.session_id, timeout=self.request_timeout, **call.kwargs),
        )

        async def end(writer: ChunkWriter, reply: Reply) -> bytes:
            return writer.end(reply, include_usage=call.include_usage)

        async with contextlib.aclosing(items):
            await relay(items, send, lambda: ChunkWriter(self.state.next_id(), self.state.model), end, phase=phase)
