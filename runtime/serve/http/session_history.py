"""History operations on an API key's sessions, as routes (what the web page needs beyond chat):

    POST /v1/sessions                    {"id", "system"?, "metadata"?, "sampling"?: {...}}  create (409 if it exists)
    POST /v1/sessions/{id}/fork          {"id": new id, "upto"?: messages kept}             a copy
    POST /v1/sessions/{id}/undo          {"n"?: exchanges, default 1}                       drop the last n
    POST /v1/sessions/{id}/rename        {"id": new id}                                     fork + delete
    GET  /v1/sessions/{id}/export        the session document (sessions.history's format), under its client id
    POST /v1/sessions/import             {"id": new id, "data": document (object or string), "overwrite"?: bool}

Each answers the session as GET /v1/sessions/{id} does (`{"id", "object": "session", "revision", ...}`).
Every id, given or in a document, is the client's and goes into the key's namespace
(runtime.serve.http.tenants): an imported document's own id is never used, so a file cannot name
another key's session; a session of another key is not found (404). Regenerate and edit are chat turns:
the page sends the shortened message list to /v1/chat/completions with the session's `X-Session-Id`.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.errors import InvalidRequest
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import Tenant, tenant_of
from sessions.model import Session

__all__ = ["PATHS", "routes"]

PATHS = frozenset({"/v1/sessions/import"})  # the others are /v1/sessions[/{id}/...]
_KEEP = ("revision", "created", "updated")


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


def _error(exc: BaseException) -> Response:
    err = to_api_error(exc)
    return Response(err.body(), status_code=err.status, media_type="application/json", headers=err.headers)


async def _body(request: Request, limit: int) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > limit:
        raise ApiError(413, f"request body is over the limit of {limit} bytes", code="body_too_large")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise ApiError.bad_request("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError.bad_request("the request body must be a JSON object")
    return body


def _str(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ApiError.bad_request(f"{name} must be a non-empty string", param=name)
    return value


def _shape(client_id: str, s: Session) -> dict[str, Any]:
    return {"id": client_id, "object": "session", "revision": s.revision, "created": s.created, "updated": s.updated}


def routes(state: ServeState, *, max_body_bytes: int) -> list[Route]:
    def target(request: Request) -> tuple[Tenant, str, str]:
        tenant = tenant_of(request)
        client_id = str(request.path_params["session_id"])
        return tenant, client_id, tenant.session_id(client_id)

    async def create(request: Request) -> Response:
        try:
            tenant = tenant_of(request)
            body = await _body(request, max_body_bytes)
            client_id = _str(body, "id")
            sampling = body.get("sampling") or {}
            if not isinstance(sampling, dict):
                raise ApiError.bad_request("sampling must be an object", param="sampling")
            system = body.get("system")
            metadata = body.get("metadata")
            rt = state.require()
            s = await rt.create_session(tenant.session_id(client_id), system=system, metadata=metadata, **sampling)
        except TypeError as e:  # an unknown sampling field
            return _error(InvalidRequest(f"sampling: {e}"))
        except Exception as e:
            return _error(e)
        return _json(_shape(client_id, s), 201)

    async def fork(request: Request) -> Response:
        try:
            tenant, _, sid = target(request)
            body = await _body(request, max_body_bytes)
            new_client = _str(body, "id")
            upto = body.get("upto")
            s = await state.require().fork(sid, tenant.session_id(new_client), upto)
        except Exception as e:
            return _error(e)
        return _json(_shape(new_client, s), 201)

    async def undo(request: Request) -> Response:
        try:
            _, client_id, sid = target(request)
            body = await _body(request, max_body_bytes)
            s = await state.require().undo(sid, body.get("n", 1))
        except Exception as e:
            return _error(e)
        return _json(_shape(client_id, s))

    async def rename(request: Request) -> Response:
        try:
            tenant, _, sid = target(request)
            body = await _body(request, max_body_bytes)
            new_client = _str(body, "id")
            rt = state.require()
            s = await rt.fork(sid, tenant.session_id(new_client))
            await rt.delete(sid)
        except Exception as e:
            return _error(e)
        return _json(_shape(new_client, s))

    async def export(request: Request) -> Response:
        try:
            _, client_id, sid = target(request)
            document = json.loads(await state.require().export(sid))
        except Exception as e:
            return _error(e)
        document["id"] = client_id  # never the internal (namespaced) id
        return _json(document)

    async def import_(request: Request) -> Response:
        try:
            tenant = tenant_of(request)
            body = await _body(request, max_body_bytes)
            client_id = _str(body, "id")
            data = body.get("data")
            if isinstance(data, dict | list):
                data = json.dumps(data)
            if not isinstance(data, str):
                raise ApiError.bad_request("data must be a session document (an object or a string)", param="data")
            overwrite = body.get("overwrite", False)
            s = await state.require().import_(data, new_id=tenant.session_id(client_id), overwrite=overwrite)
        except Exception as e:
            return _error(e)
        return _json(_shape(client_id, s), 201)

    return [
        Route("/v1/sessions", create, methods=["POST"]),
        Route("/v1/sessions/import", import_, methods=["POST"]),
        Route("/v1/sessions/{session_id}/fork", fork, methods=["POST"]),
        Route("/v1/sessions/{session_id}/undo", undo, methods=["POST"]),
        Route("/v1/sessions/{session_id}/rename", rename, methods=["POST"]),
        Route("/v1/sessions/{session_id}/export", export, methods=["GET"]),
    ]
