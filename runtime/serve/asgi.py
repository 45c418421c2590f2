"""The ASGI vocabulary every part of `runtime.serve` shares: the type aliases (the same shapes as
`starlette.types`, so these apps and middleware plug into Starlette and uvicorn) and reading a request
header from a scope.

Standard library only: the HTTP app, the Ray relay and the pure affinity router may all import it without
loading Starlette, Ray or llama.cpp.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send", "header"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of request header `name` (lower-case bytes, e.g. `b"x-session-id"`) as latin-1 text,
    or None when the request has no such header. Header names compare case-insensitively."""
    for k, v in scope.get("headers", ()):
        if bytes(k).lower() == name:
            return bytes(v).decode("latin-1")
    return None
