"""GET /v1/engine/events: the engine's decisions as server-sent events, filtered for the request's API key
(the web page's engine view; documented in docs/web.md).

Each event is `event: engine` with a JSON snapshot: the queue in arrival order, the request on the slot and
its phase (prefill progress, decoding), the cache tiers against their limits, and where each of the key's
sessions' state is now. Invariants:

- A key sees its own sessions by their client ids; another key's request (and a request without a session)
  appears only as `{"own": false}` with its kind and phase: no id, no token counts, no session name. The
  locations list holds only the key's own sessions.
- At most one event per `INTERVAL` seconds, and only when the snapshot changed: an idle server sends
  nothing after the first event. The stream ends when the client leaves or the server closes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import anyio
import msgspec
from starlette.routing import Route

from runtime.loop.engine_view import EngineView, Running, Tier, Waiting
from runtime.serve.asgi import Receive, Scope, Send
from runtime.serve.http.endpoint import send_error
from runtime.serve.http.errors import to_api_error
from runtime.serve.http.live import event, stream_events
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import Tenant, tenant_of

__all__ = ["INTERVAL", "PATHS", "for_tenant", "routes"]

PATHS = frozenset({"/v1/engine/events"})
INTERVAL = 0.25  # seconds between two events at most 4 a second
_IDLE_CHECK = 1.0  # seconds: how often an idle stream looks whether the server is closing (sends nothing)
_STATELESS = "@stateless:"


def _own(tenant: Tenant, session_id: str) -> str | None:
    """The client id of one of the tenant's sessions, None for anyone else's (or no session)."""
    if session_id.startswith(_STATELESS) or not tenant.owns(session_id):
        return None
    return tenant.client_id(session_id)


def _waiting(tenant: Tenant, w: Waiting) -> dict[str, Any]:
    sid = _own(tenant, w.session_id)
    if sid is None:
        return {"own": False, "kind": w.kind}
    return {"own": True, "session": sid, "request_id": w.request_id, "kind": w.kind, "waited": round(w.waited, 3)}


def _running(tenant: Tenant, r: Running | None) -> dict[str, Any] | None:
    if r is None:
        return None
    sid = _own(tenant, r.session_id)
    if sid is None:
        return {"own": False, "kind": r.kind, "phase": r.phase}
    return {
        "own": True,
        "session": sid,
        "request_id": r.request_id,
        "kind": r.kind,
        "phase": r.phase,
        "cached": r.cached,
        "done": r.done,
        "total": r.total,
        "generated": r.generated,
    }


def _tier(t: Tier | None) -> dict[str, Any] | None:
    return None if t is None else msgspec.structs.asdict(t)


def for_tenant(view: EngineView, tenant: Tenant) -> dict[str, Any]:
    """The part of a snapshot one key may see (its own sessions named, everyone else's anonymous)."""
    own = {cid: where for sid, where in view.locations.items() if (cid := _own(tenant, sid)) is not None}
    return {
        "queue": [_waiting(tenant, w) for w in view.queue],
        "running": _running(tenant, view.running),
        "ram": _tier(view.ram),
        "disk": _tier(view.disk),
        "shared_blocks": view.shared_blocks,
        "slot_tokens": view.slot_tokens,
        "sessions": dict(sorted(own.items())),
        "busy": view.busy,
    }


async def _events(state: ServeState, tenant: Tenant) -> AsyncGenerator[bytes, None]:
    last: dict[str, Any] | None = None
    was_busy = True
    while not state.closing and state.runtime is not None:
        rt = state.runtime
        view = rt.engine_view()
        body = for_tenant(view, tenant)
        if body != last:
            last = body
            yield event("engine", body)
        if view.busy:
            was_busy = True
            await anyio.sleep(INTERVAL)
            continue
        # idle: one more look after the work that follows the last request, then wait for the next one
        with anyio.move_on_after(INTERVAL if was_busy else _IDLE_CHECK):
            await rt.wait_submitted()
        was_busy = False


class EngineEvents:
    """The endpoint (an ASGI app for one route)."""

    def __init__(self, state: ServeState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            tenant = tenant_of(scope)
            self.state.require()
        except Exception as e:
            await send_error(send, to_api_error(e))
            return
        await stream_events(receive, send, _events(self.state, tenant))


def routes(state: ServeState) -> list[Route]:
    return [Route("/v1/engine/events", EngineEvents(state), methods=["GET"])]
