"""Run the app with uvicorn: bind first, answer 503 while the model loads, drain on SIGTERM.

`serve(config, host=..., port=...)` (a `RuntimeConfig`, or a function that opens the Runtime) binds the
socket (port 0: the OS picks one), starts uvicorn, opens the Runtime (the model loads while /health says 503),
then calls `on_ready(url)`. SIGTERM or SIGINT drains: the Runtime is closed at once, so queued requests get
503 while the running one finishes and its reply is sent; then the states are flushed to disk and the process
returns normally. A second SIGINT stops without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Generator
from contextlib import AbstractAsyncContextManager
from types import FrameType
from typing import Any

import anyio
import uvicorn

from runtime.api import Runtime
from runtime.config import RuntimeConfig
from runtime.errors import BindError
from runtime.log import get_logger
from runtime.serve.http.app import DEFAULT_MAX_BODY_BYTES, build
from runtime.serve.http.responses.store import ResponseStore
from runtime.serve.http.state import ServeState
from runtime.serve.http.tenants import Keyring

__all__ = ["bind", "serve"]

log = get_logger(__name__)

OpenRuntime = Callable[[], AbstractAsyncContextManager[Runtime]]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 if the host is an IPv6 address); BindError if it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto says TCP,
    # and with Nagle on, a keep-alive response written in two parts waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise BindError(host, port, e.strerror or str(e)) from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    """uvicorn's server with our signal handling: the first signal drains, a second SIGINT forces."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._loop = asyncio.get_running_loop()
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_exit)


async def serve(
    runtime: OpenRuntime | RuntimeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    keyring: Keyring | None = None,
    responses: ResponseStore | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    request_timeout: float | None = None,
    model_name: str | None = None,
    normalize: bool = True,
    on_ready: Callable[[str], None] | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM / SIGINT (or until the Runtime fails to open, which is raised). `runtime`: the
    config to open the Runtime with, or a function that opens it (`Runtime.open(config=..., session_store=...)`,
    `Runtime.serve(...)` over a backend of your own)."""
    open_runtime = _opener(runtime)
    state = ServeState(model_name=model_name, normalize=normalize)
    application = build(
        state,
        api_key=api_key,
        keyring=keyring,
        max_body_bytes=max_body_bytes,
        request_timeout=request_timeout,
        responses=responses,
    )
    listener = sock if sock is not None else bind(host, port)
    url = url_of(listener)
    stop = anyio.Event()

    def on_exit() -> None:
        state.closing = True
        stop.set()

    config = uvicorn.Config(
        application, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=None
    )
    server = _Server(config, on_exit)
    async with anyio.create_task_group() as tg:

        async def run_uvicorn() -> None:
            try:
                await server.serve(sockets=[listener])
            finally:
                stop.set()

        tg.start_soon(run_uvicorn)
        try:
            async with _opened(open_runtime, server) as rt:
                state.runtime = rt
                log.info("serve.ready", url=url, model=state.model)
                if on_ready is not None and not stop.is_set():
                    on_ready(url)
                await stop.wait()
                state.closing = True
                log.info("serve.draining", queued=rt.stats().scheduler.queued)
                await rt.aclose()  # queued requests fail with RuntimeClosed (503); the running one finishes
        finally:
            server.should_exit = True
    log.info("serve.stopped")


def _opener(runtime: OpenRuntime | RuntimeConfig) -> OpenRuntime:
    if isinstance(runtime, RuntimeConfig):
        config = runtime
        return lambda: Runtime.open(config=config)
    return runtime


@contextlib.asynccontextmanager
async def _opened(open_runtime: OpenRuntime, server: _Server) -> AsyncIterator[Runtime]:
    try:
        async with open_runtime() as rt:
            yield rt
    except BaseException:
        server.should_exit = True
        raise


def run(runtime: OpenRuntime | RuntimeConfig, **options: Any) -> None:
    """`serve` on a fresh event loop (blocking)."""
    anyio.run(lambda: serve(runtime, **options))
