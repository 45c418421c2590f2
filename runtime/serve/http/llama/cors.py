"""CORS as llama-server does it (`--cors-origins`), answered before the API-key check.

`origins`: "*" (any origin: the request's Origin is echoed, with credentials allowed, as llama-server's
default), "localhost" (only http(s) origins on localhost, 127.0.0.1 or [::1] are echoed), or a list of
exact origins (an Origin in the list is echoed; another gets no CORS header, so the browser refuses).
A preflight (OPTIONS) is answered 200 here, before the key check (browsers send no key with it), with
llama-server's methods and the allowed headers: "*" as llama-server's, and by name the headers that a
wildcard never covers or that turnstile reads (Authorization, X-Api-Key, X-Session-Id, ...), so a page on
another origin can send its key. Every other response gets `Access-Control-Allow-Origin` when the origin
is allowed. With no origins configured the middleware is not installed: no CORS headers at all.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from runtime.serve.asgi import ASGIApp, Message, Receive, Scope, Send, header

__all__ = ["ALLOW_HEADERS", "ALLOW_METHODS", "Cors", "allowed_origin"]

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
ALLOW_HEADERS = (
    "*, Authorization, X-Api-Key, Content-Type, X-Session-Id, Anthropic-Version, Anthropic-Beta, "
    "OpenAI-Organization, OpenAI-Project"
)
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _is_localhost(origin: str) -> bool:
    try:
        parts = urlsplit(origin)
        return parts.scheme in {"http", "https"} and parts.hostname in _LOCAL_HOSTS
    except ValueError:
        return False


def allowed_origin(origins: tuple[str, ...], origin: str | None) -> str | None:
    """The Access-Control-Allow-Origin value for a request from `origin`, or None for no header."""
    if not origin:
        return None
    if "*" in origins:
        return origin
    if "localhost" in origins and _is_localhost(origin):
        return origin
    return origin if origin in origins else None


class Cors:
    """The CORS middleware (outermost, so a preflight never reaches the key check)."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.inner = app
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        allow = allowed_origin(self.origins, header(scope, b"origin"))
        cors = [(b"access-control-allow-origin", allow.encode("latin-1"))] if allow is not None else []
        cors += [(b"access-control-allow-credentials", b"true"), (b"vary", b"Origin")] if allow is not None else []
        if scope["method"] == "OPTIONS":
            headers = [
                *cors,
                (b"access-control-allow-methods", ALLOW_METHODS.encode()),
                (b"access-control-allow-headers", ALLOW_HEADERS.encode()),
                (b"access-control-max-age", b"600"),
                (b"content-length", b"0"),
            ]
            if allow is None:  # llama-server's credentials header comes with every preflight
                headers.append((b"access-control-allow-credentials", b"true"))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return

        async def cors_send(message: Message) -> None:
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.inner(scope, receive, cors_send)
