"""One Runtime per process for every test, on its own thread and event loop, and the client tests call it with.

`Host` owns a blocking portal (a thread running an asyncio loop) and the Runtimes opened in it, one per
distinct set of settings (model, context, runtime options), each over a `CassetteBackend`, so the model loads
once per process whatever event loop each test runs on. `Client` is what the `turnstile` fixture hands a test:
the Runtime's API as awaitables on the caller's loop (asyncio or trio: the wait is bridged through anyio), with
the test's session ids in the test's own namespace (`prefix`); the caller's cancellation cancels the portal
task, which withdraws the request (a queued turn leaves the queue, a running one stops; no session changes).
"""

from __future__ import annotations

import functools
import queue
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
import msgspec

from runtime.api import Runtime
from runtime.config import RuntimeConfig
from runtime.errors import SessionNotFound
from runtime.llama.host import fingerprint_file
from runtime.reply import Reply, ToolCallDelta
from runtime.testing.pytest_plugin.backend import CassetteBackend, Counters
from sessions import MemoryStore, Session, history

__all__ = ["Client", "Host", "Settings"]

T = TypeVar("T")
_SAMPLING = frozenset({"temperature", "top_k", "top_p", "min_p", "seed"})


@dataclass(frozen=True)
class Settings:
    """What a Runtime is opened with; tests with equal settings share one Runtime (one model load)."""

    model: Path
    n_ctx: int = 2048
    n_threads: int | None = None
    cache_root: Path | None = None  # the disk tier lives in cache_root/<model fingerprint>; None: no disk tier
    options: tuple[tuple[str, Any], ...] = ()

    def config(self, data_dir: Path | None) -> RuntimeConfig:
        return RuntimeConfig.build(
            model=self.model, data_dir=data_dir, n_ctx=self.n_ctx, n_threads=self.n_threads, **dict(self.options)
        )


def _load(settings: Settings) -> Any:
    """Worker thread: build the llama backend (the disk tier under the cache root, keyed by the fingerprint)."""
    from runtime.backend.llama import LlamaBackend  # imports llama_cpp: only when a test needs the model

    root = settings.cache_root
    data_dir = root / fingerprint_file(settings.model) if root is not None and settings.model.is_file() else None
    return LlamaBackend.build(settings.config(data_dir))


@dataclass
class Host:
    """The portal thread and the Runtimes in it (module docstring). `close()` closes them all."""

    counters: Counters = field(default_factory=Counters)
    _portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
    _portal: anyio.from_thread.BlockingPortal | None = None
    _runtimes: dict[Settings, tuple[Runtime, CassetteBackend]] = field(default_factory=dict)
    _open: list[AbstractContextManager[Any]] = field(default_factory=list)

    @property
    def portal(self) -> anyio.from_thread.BlockingPortal:
        if self._portal is None:
            self._portal_cm = anyio.from_thread.start_blocking_portal("asyncio")
            self._portal = self._portal_cm.__enter__()
        return self._portal

    def runtime(self, settings: Settings) -> tuple[Runtime, CassetteBackend]:
        """The Runtime for these settings (opened on first use; the model loads when a request needs it)."""
        found = self._runtimes.get(settings)
        if found is None:
            settings.config(None)  # InvalidConfig now, in the test that asked
            backend = CassetteBackend(settings.model, settings.n_ctx, lambda: _load(settings), self.counters)
            found = (self.enter(Runtime.serve(backend, MemoryStore(), settings.config(None))), backend)
            self._runtimes[settings] = found
        return found

    def enter(self, cm: Any) -> Any:
        """Enter an async context manager in the portal; it is exited by `leave` or `close`."""
        sync = self.portal.wrap_async_context_manager(cm)
        value = sync.__enter__()
        self._open.append(sync)
        return value

    def leave(self) -> None:
        """Exit the last context entered."""
        self._open.pop().__exit__(None, None, None)

    def preload(self, backend: CassetteBackend) -> None:
        """Load the model now (off the portal's loop) so no request loads it on the loop."""
        if backend.inner is None:
            self.portal.call(functools.partial(anyio.to_thread.run_sync, backend.loaded))

    def close(self) -> None:
        try:
            while self._open:
                self.leave()
        finally:
            self._runtimes.clear()
            if self._portal_cm is not None:
                self._portal_cm.__exit__(None, None, None)
                self._portal_cm = self._portal = None


class _Handle:
    """Cancels one portal task from another thread (a started task's future cannot be cancelled)."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.cancelled = False

    async def run(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        with anyio.CancelScope() as scope:
            self.scope = scope
            if self.cancelled:
                scope.cancel()
            return await fn()
        return None  # cancelled: nobody waits for the result

    async def cancel(self) -> None:
        """On the portal's loop (calls are run in order, so this comes before the caller's next call)."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


class Client:
    """The Runtime's API for one test, awaited on the test's own event loop (module docstring).

    Session ids are the test's own: `chat("a", …)` runs in session `<prefix>a`; replies and sessions come back
    with the test's id. Turns are greedy (temperature 0) unless the test sets sampling on the request or on
    `create_session`. `backend` is the Runtime's backend (the `ScriptedBackend` of `turnstile_scripted`).
    """

    def __init__(self, portal: anyio.from_thread.BlockingPortal, rt: Runtime, prefix: str, greedy: bool) -> None:
        self.runtime = rt
        self.backend: Any = rt.backend
        self.prefix = prefix
        self._portal = portal
        self._greedy = greedy
        self._custom: set[str] = set()  # sessions created with their own sampling

    # --- bridging ------------------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T:
        handle = _Handle()
        future = self._portal.start_task_soon(handle.run, functools.partial(fn, *args, **kw))
        try:
            result: T = await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
            return result
        except anyio.get_cancelled_exc_class():
            self._portal.start_task_soon(handle.cancel)  # the Runtime withdraws the request
            raise

    async def _stream(
        self, make: Callable[[], AsyncIterator[str | ToolCallDelta | Reply]]
    ) -> AsyncIterator[str | ToolCallDelta | Reply]:
        items: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

        async def pump() -> None:
            try:
                async for item in make():
                    items.put((0, item))
            except BaseException as e:
                items.put((2, e))
                raise
            items.put((1, None))

        handle = _Handle()
        future = self._portal.start_task_soon(handle.run, pump)
        try:
            while True:
                kind, item = await anyio.to_thread.run_sync(items.get, abandon_on_cancel=True)
                if kind == 1:
                    return
                if kind == 2:
                    raise item
                yield self._reply(item) if isinstance(item, Reply) else item
        finally:
            if not future.done():
                self._portal.start_task_soon(handle.cancel)

    def sid(self, session_id: str) -> str:
        """The id the Runtime stores this test's session under."""
        return self.prefix + session_id if isinstance(session_id, str) else session_id

    def _reply(self, reply: Reply) -> Reply:
        return msgspec.structs.replace(reply, session_id=reply.session_id.removeprefix(self.prefix))

    def _session(self, session: Session) -> Session:
        return msgspec.structs.replace(session, id=session.id.removeprefix(self.prefix))

    def _sampled(self, session_id: str | None, options: dict[str, Any]) -> dict[str, Any]:
        if self._greedy and "temperature" not in options and session_id not in self._custom:
            return {**options, "temperature": 0.0}
        return options

    # --- turns ---------------------------------------------------------------------------------------

    async def chat(self, session_id: str, message: str | None = None, **options: Any) -> Reply:
        opts = self._sampled(session_id, options)
        return self._reply(await self._call(self.runtime.chat, self.sid(session_id), message, **opts))

    def stream(
        self, session_id: str, message: str | None = None, **options: Any
    ) -> AsyncIterator[str | ToolCallDelta | Reply]:
        opts = self._sampled(session_id, options)
        return self._stream(lambda: self.runtime.stream(self.sid(session_id), message, **opts))

    async def run(self, session_id: str, message: str, **options: Any) -> Reply:
        opts = self._sampled(session_id, options)
        return self._reply(await self._call(self.runtime.run, self.sid(session_id), message, **opts))

    async def regenerate(self, session_id: str, **options: Any) -> Reply:
        opts = self._sampled(session_id, options)
        return self._reply(await self._call(self.runtime.regenerate, self.sid(session_id), **opts))

    async def edit(self, session_id: str, index: int, content: str, **options: Any) -> Reply:
        opts = self._sampled(session_id, options)
        return self._reply(await self._call(self.runtime.edit, self.sid(session_id), index, content, **opts))

    async def complete(self, messages: list[dict[str, Any]], *, session_id: str | None = None, **options: Any) -> Reply:
        sid = self.sid(session_id) if session_id is not None else None
        opts = self._sampled(session_id, options)
        reply = await self._call(self.runtime.complete, messages, session_id=sid, **opts)
        return self._reply(reply) if session_id is not None else reply

    def complete_stream(
        self, messages: list[dict[str, Any]], *, session_id: str | None = None, **options: Any
    ) -> AsyncIterator[str | ToolCallDelta | Reply]:
        sid = self.sid(session_id) if session_id is not None else None
        opts = self._sampled(session_id, options)
        return self._stream(lambda: self.runtime.complete_stream(messages, session_id=sid, **opts))

    async def apply_template(self, messages: list[dict[str, Any]], **options: Any) -> str:
        return await self._call(self.runtime.apply_template, messages, **options)

    # --- sessions ------------------------------------------------------------------------------------

    async def create_session(self, session_id: str, **options: Any) -> Session:
        if _SAMPLING & set(options):
            self._custom.add(session_id)
        return self._session(await self._call(self.runtime.create_session, self.sid(session_id), **options))

    async def get_session(self, session_id: str) -> Session:
        return self._session(await self._call(self.runtime.get_session, self.sid(session_id)))

    async def list_sessions(self) -> list[str]:
        ids = await self._call(self.runtime.list_sessions)
        return sorted(i.removeprefix(self.prefix) for i in ids if i.startswith(self.prefix))

    async def undo(self, session_id: str, n: int = 1) -> Session:
        return self._session(await self._call(self.runtime.undo, self.sid(session_id), n))

    async def fork(self, session_id: str, new_id: str, upto: int | None = None) -> Session:
        if session_id in self._custom:
            self._custom.add(new_id)
        return self._session(await self._call(self.runtime.fork, self.sid(session_id), self.sid(new_id), upto))

    async def delete(self, session_id: str) -> None:
        await self._call(self.runtime.delete, self.sid(session_id))

    async def export(self, session_id: str) -> str:
        return await self._call(self.runtime.export, self.sid(session_id))

    async def import_(self, data: str, *, new_id: str | None = None, overwrite: bool = False) -> Session:
        own = new_id if new_id is not None else history.import_(data).id.removeprefix(self.prefix)
        session = await self._call(self.runtime.import_, data, new_id=self.sid(own), overwrite=overwrite)
        return self._session(session)

    def stats(self) -> Any:
        return self.runtime.stats()

    def cleanup(self) -> None:
        """Blocking (test teardown): remove every session of this test's namespace."""

        async def remove() -> None:
            for sid in await self.runtime.list_sessions():
                if sid.startswith(self.prefix):
                    with suppress(SessionNotFound):
                        await self.runtime.delete(sid)

        self._portal.call(remove)
