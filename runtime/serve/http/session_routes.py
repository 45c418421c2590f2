"""The sessions an API key made with `X-Session-Id`, as routes (OpenAI's list and delete shapes):

    GET    /v1/sessions        {"object": "list", "data": [{"id", "object": "session"}, ...]}  (the key's own)
    GET    /v1/sessions/{id}   {"id", "object": "session", "revision", "created", "updated",
                                "messages": [OpenAI-shaped messages (system first), as a session export]}
    DELETE /v1/sessions/{id}   {"id", "object": "session.deleted", "deleted": true}

Ids are the client's (`X-Session-Id`), mapped into the key's namespace (runtime.serve.http.tenants): a
session of another key is not found (404, never 403), and the list holds only the key's own sessions.
A read or a delete is queued behind the session's running turn, as the Runtime's session operations are.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.serve.http.errors import to_api_error
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import Tenant, tenant_of

__all__ = ["PATHS", "routes"]

PATHS = frozenset({"/v1/sessions"})  # and /v1/sessions/{id}, counted as "other" by /metrics


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


def _error(exc: BaseException) -> Response:
    err = to_api_error(exc)
    return Response(err.body(), status_code=err.status, media_type="application/json", headers=err.headers)


def _target(request: Request) -> tuple[Tenant, str, str]:
    tenant = tenant_of(request)
    client_id = str(request.path_params["session_id"])
    return tenant, client_id, tenant.session_id(client_id)


def routes(state: ServeState) -> list[Route]:
    async def list_sessions(request: Request) -> Response:
        try:
            tenant = tenant_of(request)
            ids = await state.require().list_sessions()
        except Exception as e:
            return _error(e)
        own = sorted(tenant.client_id(i) for i in ids if tenant.owns(i))
        return _json({"object": "list", "data": [{"id": i, "object": "session"} for i in own]})

    async def get_session(request: Request) -> Response:
        try:
            _, client_id, sid = _target(request)
            exported = json.loads(await state.require().export(sid))
        except Exception as e:
            return _error(e)
        keep = ("revision", "created", "updated", "messages")
        return _json({"id": client_id, "object": "session", **{k: exported.get(k) for k in keep}})

    async def delete_session(request: Request) -> Response:
        try:
            _, client_id, sid = _target(request)
            await state.require().delete(sid)
        except Exception as e:
            return _error(e)
        return _json({"id": client_id, "object": "session.deleted", "deleted": True})

    return [
        Route("/v1/sessions", list_sessions, methods=["GET"]),
        Route("/v1/sessions/{session_id}", get_session, methods=["GET"]),
        Route("/v1/sessions/{session_id}", delete_session, methods=["DELETE"]),
    ]
