"""The Runtime's session operations: create, read, undo, fork, delete, export and import. Each goes through
the scheduler's per-session queue, so it never races a turn of the same session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, Unpack

import anyio.to_thread

from runtime.errors import InvalidRequest, RuntimeClosed
from runtime.loop import validate as v
from runtime.loop.options import SamplingOptions
from runtime.loop.scheduler import Job, Scheduler
from runtime.types import RequestKind
from sessions import MemoryStore, Sampling, Session, history
from sessions.model import CONTEXT_POLICIES, ContextPolicy
from sessions.store import SessionStore

T = TypeVar("T")


class SessionOps:
    """Mixed into `Runtime`: what it does to stored sessions outside a turn."""

    store: SessionStore
    scheduler: Scheduler
    _closed: bool

    async def _store(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        if type(self.store) is MemoryStore:  # in memory: no thread hop (a subclass may block: it gets one)
            return fn(*args, **kw)
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kw))

    # --- sessions ------------------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str,
        *,
        system: str | None = None,
        metadata: dict[str, Any] | None = None,
        context: ContextPolicy | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> Session:
        """Create a session with a system prompt and sampling defaults (SessionExists if it exists).

        context: "error" or "window" (see `Runtime.open`); None follows the runtime's default.
        """
        v.check_session_id(session_id)
        v.check_optional_text(system, "system")
        v.check_metadata(metadata)
        if context is not None and context not in CONTEXT_POLICIES:
            raise InvalidRequest(f"context must be None or one of {CONTEXT_POLICIES}, not {context!r}")
        s = Sampling().with_overrides(**sampling)
        Session.new(session_id, system=system, sampling=s, metadata=metadata, context=context)  # checks first
        return await self._op(
            session_id,
            lambda: self.store.create(session_id, system=system, sampling=s, metadata=metadata, context=context),
        )

    async def get_session(self, session_id: str) -> Session:
        return await self._store(self.store.get, v.check_session_id(session_id))

    async def list_sessions(self) -> list[str]:
        return await self._store(self.store.list)

    async def undo(self, session_id: str, n: int = 1) -> Session:
        """Drop the last n exchanges."""
        v.check_count(n, "n")
        return await self._op(session_id, lambda: self.store.undo(session_id, n))

    async def fork(self, session_id: str, new_id: str, upto: int | None = None) -> Session:
        v.check_session_id(new_id)
        v.check_optional_count(upto, "upto", 0)
        return await self._op(session_id, lambda: self.store.fork(session_id, new_id, upto))

    async def delete(self, session_id: str) -> None:
        await self._op(session_id, lambda: self.store.delete(session_id))

    async def export(self, session_id: str) -> str:
        return await self._op(session_id, lambda: self.store.export(session_id))

    async def import_(self, data: str, *, new_id: str | None = None, overwrite: bool = False) -> Session:
        if not isinstance(overwrite, bool):
            raise InvalidRequest(f"overwrite must be a bool, not {type(overwrite).__name__}")
        sid = history.import_(data, new_id=new_id).id  # parse and validate before queueing (typed errors)
        return await self._op(sid, lambda: self.store.import_(data, new_id=new_id, overwrite=overwrite))

    async def _op(self, session_id: str, fn: Callable[[], T]) -> T:
        """A store operation, queued behind the session's running and waiting turns."""
        v.check_session_id(session_id)
        if self._closed:
            raise RuntimeClosed("the runtime is closed")

        async def execute(_job: Job[T]) -> T:
            return await self._store(fn)

        return await self.scheduler.wait(self.scheduler.submit(session_id, execute, kind=RequestKind.OP))
