"""POST /v1/chat/completions on the shared endpoint skeleton (`runtime.serve.http.endpoint`: the body limit,
a client that leaves at any moment cancels its request, while it is queued, running, or being streamed).

A streamed request waits for its first piece before the response starts, so errors raised until then (a full
queue, a prompt too long, a bad sampling value) get their own status code.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import msgspec

from runtime.api import Runtime
from runtime.loop.stream import Piece
from runtime.reply import Reply, Started
from runtime.serve.asgi import Scope, Send, header
from runtime.serve.http.chat import convert
from runtime.serve.http.chat.convert import Call
from runtime.serve.http.chat.schema import ChatRequest
from runtime.serve.http.chat.stream import ChunkWriter
from runtime.serve.http.endpoint import ClientGone, CompleteWork, Endpoint, Work, read_body, send_bytes, send_error
from runtime.serve.http.event_stream import relay
from runtime.serve.http.llama.sampler_fields import logit_bias
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
        tenant = tenant_of(scope)
        if call.session_id is not None:  # the client's id, in its tenant's namespace
            call.session_id = tenant.session_id(call.session_id)
        rt = self.state.require()
        if call.logit_bias is not None:
            call.kwargs["logit_bias"] = await logit_bias(rt, call.logit_bias)
        if call.top_logprobs is not None and not call.stream:
            for stop in [*self.state.llama.sampling.get("stop", ()), *call.kwargs.get("stop", ())]:
                call.stop_tokens[stop] = len(await rt.tokenize(stop, add_special=False, parse_special=False))
        await self.state.ledger.admit_turn(
            rt, tenant.name, tenant.namespace, call.session_id, call.kwargs, "max_tokens"
        )
        return _ChatWork(self.state, rt, call, self.request_timeout)


class _ChatWork(CompleteWork):
    def __init__(self, state: ServeState, rt: Runtime, call: Call, request_timeout: float | None) -> None:
        super().__init__(state, rt, call, request_timeout)
        self.include_usage = call.include_usage
        self.call = call
        self.prefill_progress = call.return_progress

    def body(self, reply: Reply) -> bytes:
        response = convert.response(reply, request_id=self.state.next_id(), model=self.state.model, call=self.call)
        return msgspec.json.encode(response)

    async def relay(self, items: AsyncGenerator[Piece | Started | Reply, None], send: Send, phase: Phase) -> None:
        async def end(writer: ChunkWriter, reply: Reply) -> bytes:
            return writer.end(reply, include_usage=self.include_usage)

        await relay(
            items,
            send,
            lambda: ChunkWriter(self.state.next_id(), self.state.model, self.call),
            end,
            opening=ChunkWriter.opening,
            progress=ChunkWriter.progress if self.call.return_progress else None,
            phase=phase,
        )
