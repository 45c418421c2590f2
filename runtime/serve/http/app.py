"""The OpenAI-compatible ASGI app over a Runtime: `runtime.serve.http.app(rt)`.

    POST /v1/chat/completions   chat (streamed as server-sent events with "stream": true)
    GET  /v1/models             the one model this server runs
    GET  /health                200 when ready, 503 while loading or closing (no API key needed)
    GET  /metrics               Prometheus text: queue, requests by outcome, tokens, cache loads, state bytes,
                                each key's usage against its quotas (runtime.serve.http.quotas)
    GET  /openapi.json          these routes as OpenAPI 3.1, from the request/response types (no API key needed)
    POST /apply-template, /tokenize, /detokenize   llama-server's (runtime.serve.http.template_routes)
    POST /completion, /completions, /v1/completions   a raw prompt (runtime.serve.http.llama.completion)
    POST /infill, /embedding(s), /v1/embeddings, /rerank   fill-in-the-middle, embeddings, reranking (.llama.*)
    POST /slots/{id}?action=…   llama-server's slot save/restore/erase (.llama.slot_actions)
    GET /props, /slots, /models, /v1/health; POST /chat/completions, /responses   llama-server's routes and
                                its un-prefixed OpenAI paths (runtime.serve.http.llama.routes); CORS with
                                `llama.cors_origins` (runtime.serve.http.llama.cors: preflights before the key)
    POST /v1/messages, /v1/messages/count_tokens   Anthropic's Messages API (runtime.serve.http.messages.endpoint)
    GET /v1/sessions, GET|DELETE /v1/sessions/{id}   the key's X-Session-Id sessions (.session_routes)
    POST /v1/sessions, /v1/sessions/{id}/fork|undo|rename, GET .../export, POST /v1/sessions/import
                                history operations on the key's sessions (.session_history)
    GET /v1/engine/events       the engine's decisions for this key, as server-sent events (.engine_events)
    POST /v1/rooms              an agents room (round table, debate) streamed as events (.rooms)
    GET /, /ui/{file}           the web page (runtime.serve.web; no API key needed: it asks for one)
    POST /v1/responses, GET|DELETE /v1/responses/{id}, GET .../input_items   OpenAI's Responses API, stateful
                                (runtime.serve.http.responses.endpoint; `responses`: its store, default in memory)

With `api_key` or a `keyring` (`--api-key-file`: several keys, each its own tenant), every path but
/health wants `Authorization: Bearer <key>` or `x-api-key: <key>` (compared in constant time; 401 in the
error shape of the API asked). A request is stateless unless an `X-Session-Id` header (or the request's
`user` field) names a session: its requests are then queued one at a time, in order, and its transcript
is kept in the session store, in the namespace of the request's tenant (runtime.serve.http.tenants).
"""

from __future__ import annotations

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runtime.api import Runtime
from runtime.errors import InvalidConfig
from runtime.serve import web
from runtime.serve.asgi import ASGIApp, Message, Receive, Scope, Send, header
from runtime.serve.http import engine_events, metrics, openapi, rooms, session_history
from runtime.serve.http.chat.endpoint import ChatEndpoint
from runtime.serve.http.chat.schema import ChatRequest
from runtime.serve.http.endpoint import send_error
from runtime.serve.http.errors import ApiError, is_anthropic
from runtime.serve.http.llama import completion as llama_completion
from runtime.serve.http.llama import embeddings as llama_embeddings
from runtime.serve.http.llama import infill as llama_infill
from runtime.serve.http.llama import input_tokens as llama_input_tokens
from runtime.serve.http.llama import rerank as llama_rerank
from runtime.serve.http.llama import routes as llama_routes
from runtime.serve.http.llama.cors import Cors
from runtime.serve.http.llama.options import LlamaOptions
from runtime.serve.http.messages.endpoint import PATHS as MESSAGES_PATHS
from runtime.serve.http.messages.endpoint import routes as messages_routes
from runtime.serve.http.quotas import Ledger
from runtime.serve.http.responses.endpoint import PATHS as RESPONSES_PATHS
from runtime.serve.http.responses.endpoint import ResponsesApi
from runtime.serve.http.responses.store import ResponseStore
from runtime.serve.http.session_routes import PATHS as SESSION_PATHS
from runtime.serve.http.session_routes import routes as session_routes
from runtime.serve.http.state import ServeState
from runtime.serve.http.template_routes import PATHS as TEMPLATE_PATHS
from runtime.serve.http.template_routes import routes as template_routes
from runtime.serve.http.tenants import SCOPE_KEY, Keyring, Tenant, set_tenant, tenant_of

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServeState", "app", "build"]

DEFAULT_MAX_BODY_BYTES = 8 << 20
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/openapi.json"})
COMPLETION_PATHS = (
    *llama_completion.NATIVE_PATHS,
    *llama_completion.OAI_PATHS,
    "/infill",
    *llama_embeddings.NATIVE_PATHS,
    llama_embeddings.OAI_PATH,
    *llama_rerank.PATHS,
)
TURN_PATHS = frozenset(  # POST: a turn, under quotas
    {"/v1/chat/completions", "/chat/completions", "/v1/messages", "/v1/responses", "/responses", *COMPLETION_PATHS}
)
_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/models",
        "/models",
        "/props",
        "/slots",
        "/v1/health",
        *COMPLETION_PATHS,
        *llama_input_tokens.PATHS,
        "/health",
        "/metrics",
        "/openapi.json",
        *TEMPLATE_PATHS,
        *MESSAGES_PATHS,
        *SESSION_PATHS,
        *RESPONSES_PATHS,
        *session_history.PATHS,
        *engine_events.PATHS,
        *rooms.PATHS,
        "/",
    }
)


def app(
    rt: Runtime | None,
    *,
    api_key: str | None = None,
    keyring: Keyring | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    model_name: str | None = None,
    request_timeout: float | None = None,
    responses: ResponseStore | None = None,
    llama: LlamaOptions | None = None,
) -> Starlette:
    """The ASGI app serving `rt` (None: answers 503 until `app.state.turnstile.runtime` is set).

    `api_key`: required as a bearer token on every path but /health. `max_body_bytes`: larger request
    bodies get 413. `model_name`: the id /v1/models reports (default: the model file's name).
    `request_timeout`: seconds a chat request may take in all (504 after), None for no limit.
    `llama`: what llama-server's flags set (sampling defaults, /slots, CORS origins, aliases).
    """
    return build(
        ServeState(runtime=rt, model_name=model_name, llama=llama if llama is not None else LlamaOptions()),
        api_key=api_key,
        keyring=keyring,
        max_body_bytes=max_body_bytes,
        request_timeout=request_timeout,
        responses=responses,
    )


def build(
    state: ServeState,
    *,
    api_key: str | None = None,
    keyring: Keyring | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_timeout: float | None = None,
    responses: ResponseStore | None = None,
) -> Starlette:
    """The app over a `ServeState` (the server fills in the Runtime once the model is loaded).

    `keyring` and `api_key` together: `api_key` is one more key, named "default" (Keyring.from_options)."""
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise InvalidConfig(f"max_body_bytes must be an int >= 1, not {max_body_bytes!r}")
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        raise InvalidConfig("api_key must be a non-empty str or None")
    if keyring is None:
        keyring = Keyring.from_options(api_key)
    elif api_key is not None:
        raise InvalidConfig("give api_key or keyring, not both (Keyring.from_options joins them)")
    store = responses if responses is not None else ResponseStore()
    state.ledger = Ledger(keyring.prefixes(), keyring.quotas, stored=lambda name: store.key_bytes(name))

    async def health(_request: Request) -> Response:
        try:
            state.require()
        except ApiError as e:
            return Response(e.body(), status_code=e.status, media_type="application/json")
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def openapi_json(_request: Request) -> Response:
        return Response(spec, media_type="application/json")

    async def prometheus(_request: Request) -> Response:
        if not state.llama.metrics:
            e = llama_routes.not_supported("This server does not support metrics endpoint. Start it with `--metrics`")
            return Response(e.body(), status_code=e.status, media_type="application/json")
        return Response(metrics.render(state, store), media_type=metrics.CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        err = ApiError(exc.status_code, str(exc.detail), type=kind)
        body = err.anthropic_body() if is_anthropic(request.url.path) else err.body()
        return Response(body, status_code=err.status, media_type="application/json", headers=exc.headers)

    chat = ChatEndpoint(state, max_body_bytes=max_body_bytes, request_timeout=request_timeout)
    responses_routes = ResponsesApi(
        state,
        store,
        max_body_bytes=max_body_bytes,
        request_timeout=request_timeout,
    ).routes()
    # llama-server serves OpenAI's routes with and without /v1
    unprefixed = [
        Route(r.path.removeprefix("/v1"), r.endpoint, methods=list(r.methods or ()))
        for r in responses_routes
        if isinstance(r, Route) and r.path.startswith("/v1/responses")
    ]
    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        *llama_completion.routes(state, max_body_bytes=max_body_bytes, request_timeout=request_timeout),
        *llama_routes.routes(state),
        *llama_embeddings.routes(state, max_body_bytes=max_body_bytes),
        *llama_rerank.routes(state, max_body_bytes=max_body_bytes),
        *llama_input_tokens.routes(state, max_body_bytes=max_body_bytes),
        *llama_infill.routes(state, max_body_bytes=max_body_bytes, request_timeout=request_timeout),
        *template_routes(state, max_body_bytes=max_body_bytes),
        *messages_routes(state, max_body_bytes=max_body_bytes, request_timeout=request_timeout),
        *session_routes(state),
        *session_history.routes(state, max_body_bytes=max_body_bytes),
        *engine_events.routes(state),
        *rooms.routes(state, max_body_bytes=max_body_bytes),
        *web.routes(),
        *responses_routes,
        *unprefixed,
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    served = [(r.path, m) for r in routes if isinstance(r, Route) for m in (r.methods or ()) if m != "HEAD"]
    spec = msgspec.json.encode(openapi.document(ChatRequest, served))
    application = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error},
        middleware=[
            *([Middleware(Cors, origins=state.llama.cors_origins)] if state.llama.cors_origins else []),
            Middleware(_Counting, state=state),
            Middleware(_Auth, keyring=keyring),
            Middleware(_Quota, state=state),
        ],
    )
    application.state.turnstile = state
    return application


class _Auth:
    """The API-key check on every path but the public ones: finds the request's tenant (constant-time
    comparison over all keys) and puts it into the scope; 401 in the error shape of the API asked."""

    def __init__(self, app: ASGIApp, keyring: Keyring) -> None:
        self.inner = app
        self.keyring = keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS and not web.is_public(scope["path"]):
            given = _token(scope)
            tenant = self.keyring.tenant(given)
            if tenant is None:
                code = "invalid_api_key" if given else "missing_api_key"
                msg = (
                    "incorrect API key provided"
                    if given
                    else "an API key is required (Authorization: Bearer KEY, or x-api-key: KEY)"
                )
                err = ApiError(401, msg, type="authentication_error", code=code)
                await send_error(send, err, anthropic=is_anthropic(scope["path"]))
                return
            set_tenant(scope, tenant)
        await self.inner(scope, receive, send)


class _Quota:
    """The per-request quotas of the key (requests in flight, requests and tokens per minute) on every turn
    (POST to a dialect's path): 429 with Retry-After in the dialect's error shape, before the body is read.
    After any request that may change what the key stores, its sessions and bytes are counted again (keys
    with those quotas only), so /metrics and the next admission see them."""

    def __init__(self, app: ASGIApp, state: ServeState) -> None:
        self.inner = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "DELETE") or SCOPE_KEY not in scope:
            await self.inner(scope, receive, send)
            return
        tenant, ledger, rt = tenant_of(scope), self.state.ledger, self.state.runtime
        turn = scope["method"] == "POST" and scope["path"] in TURN_PATHS
        if rt is not None:
            ledger.attach(rt)
        if turn:
            try:
                ledger.enter(tenant.name)
            except ApiError as err:
                await send_error(send, err, anthropic=is_anthropic(scope["path"]))
                return
        try:
            await self.inner(scope, receive, send)
        finally:
            if turn:
                ledger.leave(tenant.name)
            if rt is not None and ledger.measures(tenant.name):  # what it stores may have changed
                with anyio.CancelScope(shield=True):
                    await ledger.measure(rt, tenant.name)


def _token(scope: Scope) -> bytes:
    """The key a request gives: `x-api-key`, else a bearer token (b"" when neither)."""
    key = header(scope, b"x-api-key")
    if key:
        return key.strip().encode("latin-1")
    scheme, _, token = (header(scope, b"authorization") or "").encode("latin-1").partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


class _Counting:
    """Counts responses by path and status for /metrics."""

    def __init__(self, app: ASGIApp, state: ServeState) -> None:
        self.inner = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in _PATHS else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.state.responses[path, int(message["status"])] += 1
                tenant = scope.get(SCOPE_KEY)
                if isinstance(tenant, Tenant):  # counted by the key's name, never the key
                    self.state.responses_by_key[tenant.name, int(message["status"])] += 1
            await send(message)

        await self.inner(scope, receive, counting_send)
