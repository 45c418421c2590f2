"""A real uvicorn server in the test's event loop: `turnstile serve`'s `serve()` on a free loopback port over
the Runtime that `open_runtime` opens, for tests that drive it with the official clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from runtime.serve.http.server import OpenRuntime, bind, serve, url_of

__all__ = ["uvicorn_server"]


@asynccontextmanager
async def uvicorn_server(open_runtime: OpenRuntime, *, ready_within: float = 60, **options: Any) -> AsyncIterator[str]:
    """The server's URL once it listens; the server stops (and closes its Runtime) on exit. `options`: serve()'s."""
    sock, ready = bind("127.0.0.1", 0), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve(open_runtime, sock=sock, on_ready=lambda _url: ready.set(), **options))
        with anyio.fail_after(ready_within):
            await ready.wait()
        try:
            yield url_of(sock)
        finally:
            tg.cancel_scope.cancel()
