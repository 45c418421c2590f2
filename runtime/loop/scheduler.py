"""The scheduler: one queue, one worker task, one request at a time, per-session order kept.

Requests of one session run in the order they were made, one at a time. The next request's key (its
session's namespace, one per API key) is chosen first, by weighted round robin (`runtime.loop.fair`), then
the policy (`fifo`, `affinity` or `fair`) chooses among that key's sessions. A preemptive policy (`fair`) may
pause a running prefill at an n_batch boundary: the job goes back to the head of its session's queue,
keeping its arrival, and runs again later from the state it left (`PrefillPaused`); it may also stop the
running chunk itself (`runtime.loop.chunks`: llama.cpp's abort check, from a time the policy sets). The
worker awaits each job's `execute`, which runs slot work in the one worker thread; a job is never
abandoned: cancelling a caller marks its job cancelled and, if it is running, waits (shielded) until the
slot has stopped at the next token. When the worker runs out of jobs it awaits its `idle` hook once (the
Runtime's: the slot's work that could wait until the reply was out).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import anyio
import msgspec

from runtime.backend.protocol import DecodePaused, PrefillPaused
from runtime.errors import QueueFull, RequestTimeout, RuntimeClosed
from runtime.log import get_logger
from runtime.loop.chunks import ChunkAbort, SlotRate
from runtime.loop.fair import KeyShare, namespace_of
from runtime.loop.policy import Aborting, Chunk, Cost, Policy, Preemptive, Running, make_policy
from runtime.types import RequestKind

log = get_logger(__name__)

UNBOUNDED = 1 << 20  # what a generation without max_tokens has left, as the fair policy counts it

T = TypeVar("T")


@dataclass(eq=False)
class Job(Generic[T]):
    """One queued request whose `execute` returns a `T`. `cancelled` is read by the worker thread between
    tokens. `result` is set (and `error` None) once `execute` returned; `Scheduler.wait` gives it typed."""

    id: int
    session_id: str
    arrival: int
    kind: RequestKind
    execute: Callable[[Job[T]], Awaitable[T]]
    submitted: float = field(default_factory=time.perf_counter)
    skips: int = 0
    cancelled: bool = False
    started: float | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    result: T | None = None
    error: BaseException | None = None
    watchers: list[Callable[[], None]] = field(default_factory=list)  # called on the loop when done
    undo: Callable[[], Awaitable[None]] | None = None  # set by a job that committed: undoes the commit
    cost: Cost = field(default_factory=Cost)  # predicted cost (the fair policy's); exact once paused
    pauses: list[PrefillPaused] = field(default_factory=list)  # its prefill's pauses so far, in order
    paused_s: float = 0.0  # seconds spent paused (back in the queue after it had started)
    paused_at: float | None = None
    stint: float = 0.0  # when it last (re)started on the slot
    pause_check: Callable[[int, int], bool] | None = None  # the slot asks it between prefill chunks
    decode_check: Callable[[int], bool] | None = None  # the slot asks it after each generated token
    chunks: ChunkAbort | None = None  # its prefill's chunks, and from when the running one is aborted (fair)
    aborted_tokens: int = 0  # prompt tokens evaluated in chunks aborted for a pause (evaluated again later)
    aborted_s: float = 0.0  # seconds that work took
    budget: int = 0  # max_tokens as its cost said it (0: none), kept once its generation paused
    kept: object = None  # what the turn keeps across the runs of a paused generation (its text split so far)
    decoding: bool = False  # paused in its generation (it has its first token): the next run goes on from there

    @property
    def prompt_paused(self) -> bool:
        """Paused in its prefill (it has no token yet): what `Fair(defer_replies=True)` lets replies wait for."""
        return bool(self.pauses) and not self.decoding

    @property
    def carry(self) -> DecodePaused | None:
        """Its last pause when that paused its generation (the slot goes on from it), else None."""
        last = self.pauses[-1] if self.pauses else None
        return last if self.decoding and isinstance(last, DecodePaused) else None

    def drop_carry(self) -> None:
        """Free a paused generation that will not run again (the job was withdrawn or the runtime closed)."""
        carry = self.carry
        if carry is not None:
            self.decoding = False
            carry.close()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def finish(self) -> None:
        self.done.set()
        for watch in self.watchers:
            watch()


class SchedulerStats(msgspec.Struct, frozen=True):
    """Queue depth and request counters."""

    queued: int
    running: int
    submitted: int
    completed: int
    failed: int
    cancelled: int
    timed_out: int
    rejected: int
    policy: str
    max_skips: int  # the most times one request was passed over by a later one
    pauses: int = 0  # prefills paused at a chunk boundary or generations after a token (the fair policy)
    decode_pauses: int = 0  # of those, generations paused after a token
    prefill_aborts: int = 0  # of the prefill pauses, those that aborted a running chunk (its work thrown away)
    aborted_tokens: int = 0  # prompt tokens of those chunks, evaluated again later
    aborted_seconds: float = 0.0  # the seconds that work took


@dataclass
class _Counters:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    rejected: int = 0
    pauses: int = 0
    decode_pauses: int = 0
    prefill_aborts: int = 0
    aborted_tokens: int = 0
    aborted_seconds: float = 0.0


class Scheduler:
    """Queue + policy + the worker loop. Runs `job.execute(job)` for one job at a time.

    The Runtime builds it from a checked `RuntimeConfig` (`InvalidConfig` there for a bad `max_queued` or policy
    name); here `max_queued` is only asserted."""

    def __init__(
        self,
        *,
        policy: str | Policy = "fifo",
        max_queued: int = 1024,
        affinity: Callable[[str], int] = lambda _sid: 0,
        idle: Callable[[], Awaitable[None]] | None = None,
        weight: Callable[[str], int] = lambda _key: 1,
        prefill_quantum_ms: float | None = None,
        decode_quantum_ms: float | None = None,
        prefill_abort_ms: float | None = None,
        defer_replies: bool = False,
    ) -> None:
        assert max_queued >= 1, max_queued
        self._idle = idle  # awaited when the worker runs out of jobs after one (work that can wait for the reply)
        self._idle_due = False
        self.policy = make_policy(policy, prefill_quantum_ms, decode_quantum_ms, prefill_abort_ms, defer_replies)
        self.keys = KeyShare(weight)  # which key (session namespace) runs next; `weight(key)` its share
        self.on_done: list[Callable[[Job[Any]], None]] = []  # called on the loop after each job ran
        self._waiting: tuple[Job[Any], ...] = ()  # heads that could run next (read by the slot thread's pause check)
        self.max_queued = max_queued
        self._affinity = affinity
        self._queues: dict[str, deque[Job[Any]]] = {}  # per session, in arrival order; insertion order = first waiting
        self._n_queued = 0
        self._running: Job[Any] | None = None
        self._ids = itertools.count(1)
        self._wake = anyio.Event()
        self._closing = False
        self._stopped = anyio.Event()
        self._max_skips = 0
        self._n = _Counters()
        self._held: dict[str, Job[Any]] = {}  # session -> its job whose commit its caller has not taken yet
        self._submitted = anyio.Event()  # set (and replaced) on each submit: watchers of an idle engine wake
        self._rate = SlotRate()  # the slot's last prefill chunk, what a request's first chunk is predicted from

    # --- callers ------------------------------------------------------------------------------------

    def submit(
        self,
        session_id: str,
        execute: Callable[[Job[T]], Awaitable[T]],
        kind: RequestKind = RequestKind.CHAT,
        cost: Cost | None = None,
    ) -> Job[T]:
        """Queue a job (`cost`: its predicted cost, for the fair policy); raises QueueFull or RuntimeClosed."""
        if self._closing:
            raise RuntimeClosed("the runtime is closed")
        if self._n_queued >= self.max_queued:
            self._n.rejected += 1
            raise QueueFull(f"{self._n_queued} requests are already queued (max_queued={self.max_queued})")
        n = next(self._ids)
        job: Job[T] = Job(id=n, session_id=session_id, arrival=n, kind=kind, execute=execute)
        if cost is not None:
            job.cost = cost
        self._queues.setdefault(session_id, deque()).append(job)
        self._n_queued += 1
        self._publish()
        self._n.submitted += 1
        log.info("request.queued", request_id=job.id, session_id=session_id, kind=str(kind), depth=self._n_queued)
        self._wake.set()
        self._submitted.set()
        self._submitted = anyio.Event()
        return job

    async def wait(self, job: Job[T], timeout: float | None = None) -> T:
        """Wait for a job's result; a timeout or the caller's cancellation withdraws the job."""
        try:
            with anyio.fail_after(timeout) if timeout is not None else nullcontext():
                await job.done.wait()
        except TimeoutError:
            with anyio.CancelScope(shield=True):
                await self.withdraw(job, "timeout")
            self._n.timed_out += 1
            raise RequestTimeout(
                f"request {job.id} for session {job.session_id!r} did not finish within {timeout} s"
            ) from None
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self.withdraw(job, "cancelled")
            raise
        self._acknowledge(job)
        if job.error is not None:
            raise job.error
        return cast(T, job.result)  # set by `run` when there is no error (T may itself allow None)

    def _acknowledge(self, job: Job[Any]) -> None:
        """The caller has the result: its commit stands, and its session's next job may run."""
        job.undo = None
        if self._held.pop(job.session_id, None) is not None:
            self._publish()
            self._wake.set()

    async def withdraw(self, job: Job[Any], why: str) -> None:
        """Take a job back: out of the queue, or (running) stopped at the next token and waited for; a job
        that already committed (its caller went away while the reply was on its way) has its commit undone."""
        if not job.done.is_set():
            job.cancelled = True
            if self._dequeue(job):
                self._n.cancelled += 1
                job.drop_carry()
                job.finish()
                log.info("request.cancelled", request_id=job.id, session_id=job.session_id, where="queued", why=why)
                return
            # running: the slot stops at the next token or batch; wait until the turn is done
            await job.done.wait()
            log.info("request.cancelled", request_id=job.id, session_id=job.session_id, where="running", why=why)
        job.cancelled = True
        undo = job.undo
        try:
            if undo is not None:
                await undo()
                log.info("request.cancelled", request_id=job.id, session_id=job.session_id, where="committed", why=why)
        finally:
            self._acknowledge(job)

    # --- the worker ---------------------------------------------------------------------------------

    def _dequeue(self, job: Job[Any]) -> bool:
        """Take a waiting job out of its session's queue; False if it is not waiting."""
        q = self._queues.get(job.session_id)
        if q is None or job not in q:
            return False
        q.remove(job)
        if not q:
            del self._queues[job.session_id]
        self._n_queued -= 1
        self._publish()
        return True

    def _heads(self) -> list[Job[Any]]:
        # per-session order: only a head may run, and not while its session's last commit awaits its caller
        return [q[0] for sid, q in self._queues.items() if sid not in self._held]

    def _publish(self) -> None:
        """Refresh the snapshot of runnable heads the pause check reads from the slot's thread (and ask again
        whether the running chunk is to be aborted)."""
        self._waiting = tuple(self._heads())
        running = self._running
        if running is not None and running.chunks is not None:
            running.chunks.update()

    def _pause_check(self, job: Job[Any]) -> Callable[[int, int], bool] | None:
        """The check the slot calls between prefill chunks (in its thread): the policy's decision over the
        running job and the heads waiting now (an immutable snapshot), or None for a policy that never pauses."""
        policy = self.policy
        if not isinstance(policy, Preemptive):
            return None

        def check(done: int, total: int) -> bool:
            if job.cancelled:
                return False
            return policy.preempt(_prefilling(job, done, total, time.perf_counter()), self._waiting)

        return check

    def _chunk_abort(self, job: Job[Any]) -> ChunkAbort | None:
        """The job's chunk watch (kept across its runs), or None for a policy that never aborts a chunk."""
        policy = self.policy
        if not isinstance(policy, Aborting):
            return None

        def decide(chunk: Chunk, now: float, done: int, total: int) -> float:
            if job.cancelled:
                return float("inf")  # the cancel check stops it
            return policy.abort_at(_prefilling(job, done, total, now), self._waiting, chunk, now)

        return ChunkAbort(decide, self._rate)

    def _decode_check(self, job: Job[Any]) -> Callable[[int], bool] | None:
        """The check the slot calls after each generated token (in its thread), or None for a policy that never
        pauses a generation."""
        policy = self.policy
        if not isinstance(policy, Preemptive) or not getattr(policy, "pauses_decode", False):
            return None
        budget = job.budget if job.decoding else job.cost.generate

        def check(generated: int) -> bool:
            if job.cancelled:
                return False
            held = time.perf_counter() - job.stint
            left = max(0, budget - generated) if budget > 0 else UNBOUNDED
            return policy.preempt(Running(job.session_id, held, Cost(0, left), job.skips, True), self._waiting)

        return check

    def _requeue(self, job: Job[Any], paused: PrefillPaused) -> None:
        """A paused job goes back to the head of its session's queue, keeping its arrival (and so its place)."""
        job.pauses.append(paused)
        if isinstance(paused, DecodePaused):
            if not job.decoding:
                job.budget = job.cost.generate  # its max_tokens (0: none)
            job.decoding = True
            self._n.decode_pauses += 1
            job.cost = Cost(0, max(0, job.budget - paused.generated) if job.budget > 0 else UNBOUNDED)
        else:
            job.cost = Cost(paused.total - paused.done, job.cost.generate)
            if paused.aborted_tokens:
                self._n.prefill_aborts += 1
                self._n.aborted_tokens += paused.aborted_tokens
                self._n.aborted_seconds += paused.aborted_s
                job.aborted_tokens += paused.aborted_tokens
                job.aborted_s += paused.aborted_s
        job.paused_at = time.perf_counter()
        self._queues.setdefault(job.session_id, deque()).appendleft(job)
        self._n_queued += 1
        self._n.pauses += 1
        self._publish()
        log.info(
            "request.paused",
            request_id=job.id,
            session_id=job.session_id,
            done=paused.done,
            total=paused.total,
            generated=paused.generated if isinstance(paused, DecodePaused) else 0,
            aborted_tokens=paused.aborted_tokens,
            aborted_seconds=round(paused.aborted_s, 4),
            pauses=len(job.pauses),
        )

    def _pick(self) -> Job[Any] | None:
        heads = self._heads()
        if not heads:
            return None
        key = self.keys.pick((namespace_of(j.session_id), j.arrival) for j in heads)
        mine = [j for j in heads if namespace_of(j.session_id) == key]
        job = self.policy.pick(mine, lambda j: self._affinity(j.session_id))
        for j in heads:
            if j is not job and j.arrival < job.arrival:
                j.skips += 1
                self._max_skips = max(self._max_skips, j.skips)
        return job

    async def run(self) -> None:
        """The worker loop; returns after `close()` once the running job is done."""
        try:
            while True:
                job = self._pick()
                if job is None:
                    if self._closing and not self._queues:
                        return
                    if self._idle_due:
                        await self._run_idle()
                        continue  # a job may have come meanwhile
                    await self._wake.wait()
                    self._wake = anyio.Event()
                    continue
                self._dequeue(job)
                self._idle_due = self._idle is not None
                held = paused = False
                self._running = job
                job.stint = time.perf_counter()
                if job.started is None:
                    job.started = job.stint
                if job.paused_at is not None:
                    self._resumed(job)
                job.pause_check = self._pause_check(job)
                if job.chunks is None:
                    job.chunks = self._chunk_abort(job)
                job.decode_check = self._decode_check(job)
                try:
                    job.result = await job.execute(job)
                    if job.cancelled:
                        self._n.cancelled += 1
                    else:
                        self._n.completed += 1
                except PrefillPaused as p:
                    paused = not job.cancelled  # a job withdrawn meanwhile is done instead
                    if paused:
                        self._requeue(job, p)
                    else:
                        if isinstance(p, DecodePaused):
                            p.close()
                        self._n.cancelled += 1
                except Exception as e:  # delivered to the caller
                    job.error = e
                    self._n.failed += 1
                    log.warning(
                        "request.failed",
                        request_id=job.id,
                        session_id=job.session_id,
                        error=type(e).__name__,
                        message=str(e),
                    )
                finally:
                    self._running = None
                    held = job.undo is not None
                    if held:  # committed: the session waits until its caller has the reply
                        self._held[job.session_id] = job
                        self._publish()
                    if not paused:
                        job.finish()
                        self._report(job)
                if held:
                    await anyio.lowlevel.checkpoint()  # let the caller take it before the next pick
        finally:
            self._stopped.set()

    def _report(self, job: Job[Any]) -> None:
        for hook in self.on_done:
            try:
                hook(job)
            except Exception as e:  # a listener's failure is logged, never the worker's end
                log.warning("scheduler.on_done_failed", error=type(e).__name__, message=str(e))

    def _resumed(self, job: Job[Any]) -> None:
        assert job.paused_at is not None
        waited = job.stint - job.paused_at
        job.paused_s += waited
        job.paused_at = None
        job.skips = 0  # passed over at most max_skips times between two of its quanta
        done = job.pauses[-1].done if job.pauses else 0
        log.info("request.resumed", request_id=job.id, session_id=job.session_id, done=done, paused=round(waited, 4))

    async def _run_idle(self) -> None:
        """The idle hook, once per run of jobs; a failure is logged, never the worker's end."""
        self._idle_due = False
        assert self._idle is not None
        try:
            await self._idle()
        except Exception as e:
            log.warning("scheduler.idle_failed", error=type(e).__name__, message=str(e))

    async def close(self) -> None:
        """Refuse new jobs, fail queued ones with RuntimeClosed, let the running one finish."""
        self._closing = True
        for q in self._queues.values():
            for job in q:
                job.error = RuntimeClosed("the runtime closed before this request ran")
                job.drop_carry()
                job.finish()
        self._queues.clear()
        self._n_queued = 0
        self._publish()
        self._wake.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    @property
    def running(self) -> Job[Any] | None:
        return self._running

    def __len__(self) -> int:
        return self._n_queued

    def waiting(self) -> list[Job[Any]]:
        """The queued jobs in arrival order (a copy; the policy may still run them in another order)."""
        return sorted((job for q in self._queues.values() for job in q), key=lambda j: j.arrival)

    @property
    def busy(self) -> bool:
        """A job runs or waits, or the idle work after the last one is still due."""
        return self._running is not None or self._n_queued > 0 or self._idle_due

    async def wait_submitted(self) -> None:
        """Wait until the next job is submitted."""
        await self._submitted.wait()

    def stats(self) -> SchedulerStats:
        n = self._n
        return SchedulerStats(
            queued=self._n_queued,
            running=int(self._running is not None),
            submitted=n.submitted,
            completed=n.completed,
            failed=n.failed,
            cancelled=n.cancelled,
            timed_out=n.timed_out,
            rejected=n.rejected,
            policy=self.policy.name,
            max_skips=self._max_skips,
            pauses=n.pauses,
            decode_pauses=n.decode_pauses,
            prefill_aborts=n.prefill_aborts,
            aborted_tokens=n.aborted_tokens,
            aborted_seconds=n.aborted_seconds,
        )


def _prefilling(job: Job[Any], done: int, total: int, now: float) -> Running:
    """A job in its prefill, `done` of `total` prompt tokens in the slot, as a policy sees it at `now`."""
    return Running(job.session_id, now - job.stint, Cost(total - done, job.cost.generate), job.skips)
