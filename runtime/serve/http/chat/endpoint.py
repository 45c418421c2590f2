"""POST /v1/chat/completions on the shared endpoint skeleton (`runtime.serve.http.endpoint`: the body limit,
a client that leaves at any moment cancels its request, while it is queued, running, or being streamed).

A streamed request waits for its first piece before the response starts, so errors raised until then (a full
queue, a prompt too long, a bad sampling value) get their own status code.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any, cast

import msgspec

from runtime.api import Runtime
from runtime.loop.stream import Piece
from runtime.reply import Reply, Started
from runtime.serve.asgi import Scope, Send, header
from runtime.serve.http.chat import convert
from runtime.serve.http.chat.convert import Call
from runtime.serve.http.chat.schema import ChatRequest
from runtime.serve.http.chat.stream import ChunkWriter
from runtime.serve.http.endpoint import ClientGone, Endpoint, Work, read_body, send_bytes, send_error
from runtime.serve.http.event_stream import relay
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import tenant_of
from runtime.serve.http.tolerance import declared
from runtime.serve.http.watch import Phase

# read_body, send_bytes, send_error and ClientGone live in runtime.serve.http.endpoint (importable here too)
__all__ = ["ChatEndpoint", "ClientGone", "read_body", "send_bytes", "send_error"]

_decoder = msgspec.json.Decoder(ChatRequest)
_KNOWN = declared(ChatRequest)


class ChatEndpoint(Endpoint):
    """The chat completions endpoint (an ASGI app for one route)."""

    wants = "a JSON chat completion request"

    async def accept(self, body: bytes, scope: Scope) -> Work:
        req = _decoder.decode(body)
        self.state.unknown_fields.note("chat", body, _KNOWN)
        call = convert.from_request(req, header(scope, b"x-session-id"))
        if call.session_id is not None:  # the client's id, in its tenant's namespace
            call.session_id = tenant_of(scope).session_id(call.session_id)
        return _ChatWork(self.state, self.state.require(), call, self.request_timeout)


class _ChatWork(Work):
    def __init__(self, state: ServeState, rt: Runtime, call: Call, request_timeout: float | None) -> None:
        self.state, self.rt, self.call, self.request_timeout = state, rt, call, request_timeout

    async def run(self, send: Send, phase: Phase) -> None:
        if self.call.stream:
            await self._stream(self.rt, self.call, send, phase)
        else:
            await self._complete(self.rt, self.call, send, phase)

    def gone(self) -> tuple[str, dict[str, Any]]:
        return "serve.client_gone", {"session_id": self.call.session_id, "stream": self.call.stream}

    async def _complete(self, rt: Runtime, call: Call, send: Send, phase: Phase) -> None:
        reply = await rt.complete(
            call.messages, session_id=call.session_id, timeout=self.request_timeout, **call.kwargs
        )
        body = msgspec.json.encode(convert.response(reply, request_id=self.state.next_id(), model=self.state.model))
        phase.ending = True
        await send_bytes(send, 200, body)

    async def _stream(self, rt: Runtime, call: Call, send: Send, phase: Phase) -> None:
        items = cast(
            AsyncGenerator[Piece | Started | Reply, None],
            rt.complete_stream_started(
                call.messages,
                session_id=call.session_id,
                timeout=self.request_timeout,
                **call.kwargs,
            ),
        )

        async def end(writer: ChunkWriter, reply: Reply) -> bytes:
            return writer.end(reply, include_usage=call.include_usage)

        async with contextlib.aclosing(items):
            await relay(items, send, lambda: ChunkWriter(self.state.next_id(), self.state.model), end, phase=phase)
