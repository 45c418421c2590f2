"""POST /v1/messages and POST /v1/messages/count_tokens: the Anthropic Messages API as plain ASGI endpoints.

They behave as the chat completions endpoint (runtime.serve.http.chat.endpoint): the body read with its size
checked, a client that leaves cancels its request (nothing is committed), a streamed request waits for
its first piece before the response starts (so early errors get their status), and every error is in
Anthropic's shape. Stateless unless an `X-Session-Id` header names a session (in the tenant's namespace):
then the session's transcript becomes the request's messages and the reply, as with chat completions.

count_tokens renders the prompt exactly as a turn would (the same conversion, then `Runtime.count_tokens`: the
turn's tool plan and reasoning controls over the Runtime's) and counts its tokens: `{"input_tokens": N}`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from starlette.routing import Route

from runtime.api import Runtime
from runtime.loop.stream import Piece
from runtime.reply import Reply, Started
from runtime.serve.asgi import Scope, Send, header
from runtime.serve.http.endpoint import CompleteWork, Endpoint, Work, send_bytes
from runtime.serve.http.event_stream import relay
from runtime.serve.http.messages import convert as anthropic
from runtime.serve.http.messages.convert import CountRequest, MessagesRequest
from runtime.serve.http.messages.stream import MessageEvents
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import tenant_of
from runtime.serve.http.tolerance import declared
from runtime.serve.http.watch import Phase

__all__ = ["PATHS", "CountTokensEndpoint", "MessagesEndpoint", "count_tokens", "routes"]

PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
_messages = msgspec.json.Decoder(MessagesRequest)
_count = msgspec.json.Decoder(CountRequest)
_KNOWN = declared(MessagesRequest)  # count_tokens gets whole Messages bodies too: the same fields are known


class MessagesEndpoint(Endpoint):
    """POST /v1/messages."""

    wants = "a JSON Messages request"
    anthropic = True

    async def accept(self, body: bytes, scope: Scope) -> Work:
        req = _messages.decode(body)
        self.state.unknown_fields.note("messages", body, _KNOWN)
        client_id = header(scope, b"x-session-id")
        tenant = tenant_of(scope)
        session_id = tenant.session_id(client_id) if client_id else None
        call = anthropic.from_request(req, session_id, normalize=self.state.normalize)
        rt = self.state.require()
        await self.state.ledger.admit_turn(rt, tenant.name, tenant.namespace, session_id, call.kwargs, "max_tokens")
        return _MessagesWork(self.state, rt, call, self.request_timeout)


class _MessagesWork(CompleteWork):
    api = "messages"

    def body(self, reply: Reply) -> bytes:
        return msgspec.json.encode(anthropic.message_body(reply, id=anthropic.message_id(), model=self.state.model))

    async def relay(self, items: AsyncGenerator[Piece | Started | Reply, None], send: Send, phase: Phase) -> None:
        async def end(events: MessageEvents, reply: Reply) -> bytes:
            return events.end(reply)

        # pieces: thinking, answer text, or a piece of a tool call
        make = lambda: MessageEvents(anthropic.message_id(), self.state.model)  # noqa: E731
        await relay(
            items, send, make, end, opening=MessageEvents.start, keepalive_event=MessageEvents.ping, phase=phase
        )


async def count_tokens(rt: Runtime, req: CountRequest, *, normalize: bool = True) -> int:
    """The prompt's token count for a request, rendered as a turn renders it (`Runtime.count_tokens`)."""
    messages, kw = anthropic.prompt_of(req, normalize=normalize)
    return await rt.count_tokens(messages, **kw)


class _Counted(Work):
    def __init__(self, rt: Runtime, messages: list[dict[str, Any]], kw: dict[str, Any]) -> None:
        self.rt, self.messages, self.kw = rt, messages, kw

    async def run(self, send: Send, phase: Phase) -> None:
        n = await self.rt.count_tokens(self.messages, **self.kw)
        phase.ending = True
        await send_bytes(send, 200, msgspec.json.encode({"input_tokens": n}))

    def gone(self) -> tuple[str, dict[str, Any]]:
        return "serve.client_gone", {"api": "count_tokens"}


class CountTokensEndpoint(Endpoint):
    """POST /v1/messages/count_tokens."""

    wants = "a JSON Messages request"
    anthropic = True

    async def accept(self, body: bytes, scope: Scope) -> Work:
        req = _count.decode(body)
        self.state.unknown_fields.note("messages", body, _KNOWN)
        messages, kw = anthropic.prompt_of(req, normalize=self.state.normalize)
        return _Counted(self.state.require(), messages, kw)


def routes(state: ServeState, *, max_body_bytes: int, request_timeout: float | None) -> list[Route]:
    """The two routes, for the app to mount."""
    endpoint: Any = MessagesEndpoint(state, max_body_bytes=max_body_bytes, request_timeout=request_timeout)
    counter: Any = CountTokensEndpoint(state, max_body_bytes=max_body_bytes)
    return [
        Route("/v1/messages", endpoint, methods=["POST"]),
        Route("/v1/messages/count_tokens", counter, methods=["POST"]),
    ]
