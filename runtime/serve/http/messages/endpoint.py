"""POST /v1/messages and POST /v1/messages/count_tokens: the Anthropic Messages API as plain ASGI endpoints.

They behave as the chat completions endpoint (runtime.serve.http.chat.endpoint): the body read with its size
checked, a client that leaves cancels its request (nothing is committed), a streamed request waits for
its first piece before the response starts (so early errors get their status), and every error is in
Anthropic's shape. Stateless unless an `X-Session-Id` header names a session (in the tenant's namespace):
then the session's transcript becomes the request's messages and the reply, as with chat completions.

count_tokens renders the prompt exactly as a turn would (the same conversion, tool plan and reasoning
switch; the Runtime's own defaults aside) and counts its tokens: `{"input_tokens": N}`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any, cast

import anyio
import anyio.to_thread
import msgspec
from starlette.routing import Route

from runtime.api import Runtime
from runtime.backend.protocol import SlotBackend
from runtime.log import get_logger
from runtime.loop import validate
from runtime.reasoning import ReasoningOptions
from runtime.reply import Reply, ToolCallDelta
from runtime.serve.asgi import Receive, Scope, Send, header
from runtime.serve.http.chat.endpoint import ClientGone, read_body, send_bytes, send_error
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.event_stream import relay
from runtime.serve.http.messages import convert as anthropic
from runtime.serve.http.messages.convert import CountRequest, MessagesCall, MessagesRequest
from runtime.serve.http.messages.stream import MessageEvents
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import tenant_of
from runtime.serve.http.watch import Phase, run_watched
from runtime.tools.plan import ToolPlan

__all__ = ["PATHS", "CountTokensEndpoint", "MessagesEndpoint", "count_tokens", "routes"]

log = get_logger(__name__)

PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
_messages = msgspec.json.Decoder(MessagesRequest)
_count = msgspec.json.Decoder(CountRequest)


async def _fail(send: Send, exc: BaseException) -> None:
    await send_error(send, to_api_error(exc), anthropic=True)


async def _body(scope: Scope, receive: Receive, limit: int) -> bytes:
    body = await read_body(scope, receive, limit)
    if not body.strip():
        raise ApiError.bad_request("the request body is empty (want a JSON Messages request)")
    return body


class MessagesEndpoint:
    """POST /v1/messages."""

    def __init__(self, state: ServeState, *, max_body_bytes: int, request_timeout: float | None) -> None:
        self.state = state
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            req = _messages.decode(await _body(scope, receive, self.max_body_bytes))
            client_id = header(scope, b"x-session-id")
            session_id = tenant_of(scope).session_id(client_id) if client_id else None
            call = anthropic.from_request(req, session_id)
            rt = self.state.require()
        except ClientGone:
            return
        except Exception as e:  # before anything was queued: an error response
            await _fail(send, e)
            return

        async def work(phase: Phase) -> None:
            if call.stream:
                await self._stream(rt, call, send, phase)
            else:
                await self._complete(rt, call, send, phase)

        async def fail(e: Exception) -> None:
            await _fail(send, e)

        phase = await run_watched(receive, work, fail)
        if phase.gone:
            self.state.disconnects += 1
            log.info("serve.client_gone", session_id=call.session_id, stream=call.stream, api="messages")

    async def _complete(self, rt: Runtime, call: MessagesCall, send: Send, phase: Phase) -> None:
        reply = await rt.complete(
            call.messages, session_id=call.session_id, timeout=self.request_timeout, **call.kwargs
        )
        body = anthropic.message_body(reply, id=anthropic.message_id(), model=self.state.model)
        phase.ending = True
        await send_bytes(send, 200, msgspec.json.encode(body))

    async def _stream(self, rt: Runtime, call: MessagesCall, send: Send, phase: Phase) -> None:
        items = cast(
            AsyncGenerator[str | ToolCallDelta | Reply, None],
            rt.complete_stream(call.messages, session_id=call.session_id, timeout=self.request_timeout, **call.kwargs),
        )

        async def end(events: MessageEvents, reply: Reply) -> bytes:
            return events.end(reply)

        async with contextlib.aclosing(items):  # pieces: thinking, answer text, or a piece of a tool call
            make = lambda: MessageEvents(anthropic.message_id(), self.state.model)  # noqa: E731
            await relay(items, send, make, end, opening=MessageEvents.start, phase=phase)


def count_tokens(backend: SlotBackend, req: CountRequest) -> int:
    """The prompt's token count for a request, rendered as a turn renders it (blocking: a worker thread)."""
    messages, kw = anthropic.prompt_of(req)
    chat = validate.check_conversation(messages, "count").chat_messages()
    reasoning: dict[str, Any] = {n: kw[n] for n in ("reasoning", "reasoning_budget") if n in kw}
    try:
        variables = ReasoningOptions.from_values(reasoning).template_variables(backend.reasoning_format())
    except ValueError as e:
        raise ApiError.bad_request(str(e), param="thinking") from None
    if "tools" in kw:
        plan = ToolPlan.build(backend.tool_format(), kw["tools"], kw.get("tool_choice", "auto")).render_plan(chat)
        kwargs = {**variables, **(plan.kwargs or {})}
        rendered = backend.prepare(plan.messages, spans=False, tools=plan.tools, template_kwargs=kwargs or None)
    else:
        rendered = backend.prepare(chat, spans=False, template_kwargs=variables or None)
    return len(rendered.tokens)


class CountTokensEndpoint:
    """POST /v1/messages/count_tokens."""

    def __init__(self, state: ServeState, *, max_body_bytes: int) -> None:
        self.state = state
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            req = _count.decode(await _body(scope, receive, self.max_body_bytes))
            backend = self.state.require().backend
            n = await anyio.to_thread.run_sync(lambda: count_tokens(backend, req))
        except ClientGone:
            return
        except Exception as e:
            await _fail(send, e)
            return
        await send_bytes(send, 200, msgspec.json.encode({"input_tokens": n}))


def routes(state: ServeState, *, max_body_bytes: int, request_timeout: float | None) -> list[Route]:
    """The two routes, for the app to mount."""
    endpoint: Any = MessagesEndpoint(state, max_body_bytes=max_body_bytes, request_timeout=request_timeout)
    counter: Any = CountTokensEndpoint(state, max_body_bytes=max_body_bytes)
    return [
        Route("/v1/messages", endpoint, methods=["POST"]),
        Route("/v1/messages/count_tokens", counter, methods=["POST"]),
    ]
