"""One POST through an app's raw ASGI interface, for tests that decide when the client leaves (httpx's
ASGITransport cannot disconnect mid-request)."""

from __future__ import annotations

import json
from typing import Any

import anyio


class RawClient:
    """One JSON POST to `path` through the raw ASGI interface; `leave()` disconnects it at any moment.

    `sent` keeps every ASGI message the app sent; `first_body` is set at the first non-empty body piece."""

    def __init__(self, path: str, body: dict[str, Any], session: str | None = None) -> None:
        self.path = path
        self.body = json.dumps(body).encode()
        self.headers = [(b"content-type", b"application/json")]
        if session:
            self.headers.append((b"x-session-id", session.encode()))
        self.sent: list[dict[str, Any]] = []
        self.first_body = anyio.Event()
        self._left = anyio.Event()
        self._read = False

    def leave(self) -> None:
        self._left.set()

    async def receive(self) -> dict[str, Any]:
        if not self._read:
            self._read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.first_body.set()

    def text(self) -> str:
        """The response body received so far."""
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body").decode()

    async def run(self, application: Any) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "headers": self.headers,
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
            "root_path": "",
        }
        await application(scope, self.receive, self.send)
