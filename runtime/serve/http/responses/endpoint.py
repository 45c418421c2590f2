"""The OpenAI Responses API, stateful: POST /v1/responses, GET and DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

A request becomes the same turn as a chat completion (`Runtime.complete` over the conversation's messages).
With `store` (the default) the conversation is kept in a session of the request's tenant and the response
as a `Record` in the `ResponseStore`; `previous_response_id` continues it: the history comes from the
session store (only the new input travels), the KV state from the slot, RAM or disk like any returning
conversation. The newest revision of a session is continued in place; any other (an earlier response, or
a second continuation of the same one) branches into a new session with the prefix, so a parent's history
never changes (`runtime.serve.http.responses.store`). `store: false` keeps nothing. Another tenant's ids,
like unknown and evicted ones, are 404.

`instructions` are the system prompt of this request only (as OpenAI's: not carried over by
`previous_response_id`); system messages leading the first input are carried with the conversation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

import anyio
import anyio.to_thread
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.api import Runtime
from runtime.errors import ResponseNotFound, SessionNotFound
from runtime.log import get_logger
from runtime.reply import Reply, Started, ToolCallDelta
from runtime.serve.asgi import Scope, Send
from runtime.serve.http.chat.convert import timings
from runtime.serve.http.endpoint import Endpoint, Work, send_bytes
from runtime.serve.http.errors import ApiError
from runtime.serve.http.event_stream import relay
from runtime.serve.http.responses import convert as rc
from runtime.serve.http.responses.schema import ResponsesRequest
from runtime.serve.http.responses.store import Record, ResponseStore
from runtime.serve.http.responses.stream import EventWriter
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import Tenant, tenant_of
from runtime.serve.http.tolerance import declared
from runtime.serve.http.watch import Phase

__all__ = ["PATHS", "ResponsesApi"]

log = get_logger(__name__)

PATHS = frozenset({"/v1/responses"})
_decoder = msgspec.json.Decoder(ResponsesRequest)
_KNOWN = declared(ResponsesRequest)


def _not_found(e: ResponseNotFound, param: str | None = None) -> ApiError:
    return ApiError(404, str(e), type="invalid_request_error", code="response_not_found", param=param)


def _json(body: object, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


class _Plan:
    """One accepted request, ready to run: the messages, the target session, what to record."""

    def __init__(self, req: ResponsesRequest, tenant: Tenant, turn: rc.Turn, prev: Record | None) -> None:
        self.req, self.tenant, self.turn, self.prev = req, tenant, turn, prev
        self.id = rc.new_id("resp")
        self.created = int(time.time())
        self.system = prev.system if prev is not None else turn.system  # carried with the conversation
        self.history: list[dict[str, Any]] = []
        self.session: str | None = None  # None: stateless (store false)
        self.claimed = False  # continuing prev's session in place
        self.recorded = False

    def messages(self) -> list[dict[str, Any]]:
        prompt = rc.join_system(self.req.instructions, self.system)
        head = [{"role": "system", "content": prompt}] if prompt else []
        return head + self.history + self.turn.messages

    def response(self, model: str) -> dict[str, Any]:
        """The response object without its outcome (status, output, usage set by `finish`)."""
        r = self.req
        effort = r.reasoning.effort if r.reasoning is not None else None
        fmt = r.text.format if r.text is not None and r.text.format is not None else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": model,
            "output": [],
            "parallel_tool_calls": True if r.parallel_tool_calls is None else r.parallel_tool_calls,
            "previous_response_id": r.previous_response_id,
            "reasoning": {"effort": effort, "summary": None},
            "store": r.store,
            "temperature": r.temperature,
            "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
            "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
            "tools": msgspec.to_builtins(r.tools or []),
            "top_p": r.top_p,
            "truncation": r.truncation or "disabled",
            "usage": None,
            "user": r.user,
            "metadata": r.metadata or {},
        }


class ResponsesApi:
    """The Responses endpoints over a ServeState and a ResponseStore."""

    def __init__(
        self, state: ServeState, store: ResponseStore, *, max_body_bytes: int, request_timeout: float | None
    ) -> None:
        self.state = state
        self.store = store
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", _Asgi(self), methods=["POST"]),
            Route("/v1/responses/{response_id}", self.get, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", self.input_items, methods=["GET"]),
        ]

    async def _thread(self, fn: Any, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    # --- reading and deleting ------------------------------------------------------------------------

    async def _record(self, request: Request) -> Record:
        try:
            return cast(Record, await self._thread(self.store.get, tenant_of(request).name, _rid(request)))
        except ResponseNotFound as e:
            raise _not_found(e) from None

    async def get(self, request: Request) -> Response:
        try:
            return _json((await self._record(request)).response)
        except ApiError as e:
            return Response(e.body(), status_code=e.status, media_type="application/json")

    async def delete(self, request: Request) -> Response:
        rid = _rid(request)
        try:
            orphans = await self._thread(self.store.delete, tenant_of(request).name, rid)
        except ResponseNotFound as e:
            err = _not_found(e)
            return Response(err.body(), status_code=err.status, media_type="application/json")
        await self._drop_sessions(orphans)
        return _json({"id": rid, "object": "response.deleted", "deleted": True})

    async def input_items(self, request: Request) -> Response:
        try:
            limit, order, after = _page_args(request)
            items = list((await self._record(request)).items)
        except ApiError as e:
            return Response(e.body(), status_code=e.status, media_type="application/json")
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                err = ApiError.bad_request(f"after: no input item {after!r} in this response", param="after")
                return Response(err.body(), status_code=400, media_type="application/json")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return _json(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    async def _drop_sessions(self, sessions: list[str]) -> None:
        rt = self.state.runtime
        if rt is None:
            return
        for sid in sessions:
            with contextlib.suppress(SessionNotFound):
                await rt.delete(sid)
            log.info("responses.session_deleted", session_id=sid)

    # --- creating ------------------------------------------------------------------------------------

    async def accept(self, body: bytes, scope: Scope) -> _Create:
        req = _decoder.decode(body)
        self.state.unknown_fields.note("responses", body, _KNOWN)
        turn = rc.parse(req)
        rt = self.state.require()
        tenant = tenant_of(scope)
        plan = await self._plan(rt, req, tenant, turn)
        try:
            await self.state.ledger.admit_turn(
                rt, tenant.name, tenant.namespace, plan.session, plan.turn.kwargs, "max_output_tokens"
            )
        except BaseException:  # over a quota: the claim or the new session goes, nothing was queued
            with anyio.CancelScope(shield=True):
                await self._abandon(plan)
            raise
        return _Create(self, rt, plan)

    async def _plan(self, rt: Runtime, req: ResponsesRequest, tenant: Tenant, turn: rc.Turn) -> _Plan:
        prev: Record | None = None
        if req.previous_response_id is not None:
            try:
                prev = await self._thread(self.store.get, tenant.name, req.previous_response_id)
            except ResponseNotFound as e:
                raise _not_found(e, "previous_response_id") from None
            if turn.system is not None:
                raise ApiError.bad_request(
                    "a system or developer message cannot continue a conversation (use instructions)", param="input"
                )
        plan = _Plan(req, tenant, turn, prev)
        if prev is not None:
            try:
                session = await rt.get_session(prev.session)
            except SessionNotFound:
                raise _not_found(ResponseNotFound(prev.id), "previous_response_id") from None
            plan.history = [m.to_openai() for m in session.messages[: prev.upto]]
        if req.store:
            if prev is not None and await self._thread(self.store.claim, prev):
                plan.session, plan.claimed = prev.session, True
            else:
                plan.session = tenant.session_id(rc.new_id("conv"))
        return plan

    async def _release(self, plan: _Plan) -> None:
        if plan.claimed and plan.session is not None:
            plan.claimed = False
            await self._drop_sessions(await self._thread(self.store.release, plan.session))

    async def _abandon(self, plan: _Plan) -> None:
        """A plan that ends unrecorded: release its claim, or delete the new session it may have made."""
        if plan.claimed:
            await self._release(plan)
        elif plan.session is not None:
            await self._drop_sessions([plan.session])

    def _kwargs(self, plan: _Plan) -> dict[str, Any]:
        return {
            "session_id": plan.session,
            "timeout": self.request_timeout,
            **self.state.llama.sampling,
            **plan.turn.kwargs,
        }

    async def _run(self, rt: Runtime, plan: _Plan) -> Reply:
        return await rt.complete(plan.messages(), **self._kwargs(plan))

    async def _finish(self, rt: Runtime, plan: _Plan, reply: Reply) -> dict[str, Any]:
        """The completed response object (not recorded yet)."""
        final = plan.response(self.state.model)
        length = reply.finish_reason == "length"
        final["status"] = "incomplete" if length else "completed"
        final["incomplete_details"] = {"reason": "max_output_tokens"} if length else None
        final["output"] = rc.output_items(reply, plan.turn.top_logprobs)
        reasoning = len(await rt.tokenize(reply.reasoning)) if reply.reasoning else 0
        final["usage"] = rc.usage(reply, reasoning)
        return final

    async def _keep(self, plan: _Plan, final: dict[str, Any]) -> None:
        """Record the response when the request stores (and delete the sessions its evictions freed)."""
        if plan.session is not None:
            record = Record(
                id=plan.id,
                tenant=plan.tenant.name,
                session=plan.session,
                upto=len(plan.history) + len(plan.turn.messages) + 1,
                system=plan.system,
                response=final,
                items=plan.turn.items,
            )
            orphans = await self._thread(self.store.put, record)
            plan.claimed, plan.recorded = False, True
            await self._drop_sessions(orphans)
        log.info("responses.done", response_id=plan.id, stored=plan.session is not None, status=final["status"])

    async def _stream(self, rt: Runtime, plan: _Plan, send: Send) -> None:
        items = cast(
            AsyncGenerator[str | ToolCallDelta | Started | Reply, None],
            rt.complete_stream_started(
                plan.messages(), prefill_progress=plan.turn.return_progress, **self._kwargs(plan)
            ),
        )
        live = plan.turn.timings_per_token or plan.turn.return_progress

        async def end(writer: EventWriter, reply: Reply) -> bytes:
            final = await self._finish(rt, plan, reply)
            last = writer.end(final, timings(reply) if live else None)  # the output as streamed (its item ids)
            await self._keep(plan, final)
            return last

        async with contextlib.aclosing(items):  # pieces: reasoning, answer text, or a piece of a function call
            await relay(
                items,
                send,
                lambda: EventWriter(plan.response(self.state.model), plan.turn.top_logprobs, live=live),
                end,
                opening=EventWriter.start,
                progress=EventWriter.progress if plan.turn.return_progress else None,
            )


class _Create(Work):
    """One accepted POST /v1/responses: its plan, run while its client is watched, abandoned unless recorded."""

    def __init__(self, api: ResponsesApi, rt: Runtime, plan: _Plan) -> None:
        self.api, self.rt, self.plan = api, rt, plan

    async def run(self, send: Send, phase: Phase) -> None:
        api, rt, plan = self.api, self.rt, self.plan
        if plan.req.stream:
            await api._stream(rt, plan, send)
        else:
            final = await api._finish(rt, plan, await api._run(rt, plan))
            await api._keep(plan, final)
            phase.ending = True
            await send_bytes(send, 200, msgspec.json.encode(final))

    async def close(self) -> None:
        if not self.plan.recorded:  # an error, or the client left: the session is free again, or goes
            await self.api._abandon(self.plan)

    def gone(self) -> tuple[str, dict[str, Any]]:
        return "responses.client_gone", {"response_id": self.plan.id, "stream": self.plan.req.stream}


class _Asgi(Endpoint):
    """POST /v1/responses as a plain ASGI app on the shared skeleton (`runtime.serve.http.endpoint`)."""

    wants = "a JSON Responses request"

    def __init__(self, api: ResponsesApi) -> None:
        super().__init__(api.state, max_body_bytes=api.max_body_bytes, request_timeout=api.request_timeout)
        self.api = api

    async def accept(self, body: bytes, scope: Scope) -> Work:
        return await self.api.accept(body, scope)


def _rid(request: Request) -> str:
    return str(request.path_params["response_id"])


def _page_args(request: Request) -> tuple[int, str, str | None]:
    q = request.query_params
    raw = q.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise ApiError.bad_request(f"limit must be an integer from 1 to 100, not {raw!r}", param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError.bad_request(f"order must be 'asc' or 'desc', not {order!r}", param="order")
    return int(raw), order, q.get("after")
