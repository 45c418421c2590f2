"""Aborting a prefill chunk for a waiting request, without a model: the fair policy's decision (`abort_at`), the
chunk watch's prediction and bookkeeping (`ChunkAbort`), the options, and the scheduler asking again when a
request arrives during a chunk (real anyio tasks; the "chunk" is a task that runs until the watch's time)."""

from __future__ import annotations

import math
import time

import anyio
import pytest

from runtime.backend.protocol import PrefillPaused
from runtime.cli import build_parser
from runtime.config import RuntimeConfig
from runtime.errors import InvalidConfig
from runtime.log import capture_logs
from runtime.loop.chunks import ChunkAbort, SlotRate
from runtime.loop.policy import MAX_ABORTS, PREFILL_ABORT_MS, Chunk, Cost, Fair, make_policy
from runtime.loop.scheduler import Job, Scheduler
from tests.support.policy_cases import C, running

INF = math.inf


SHORT = [C("s", 5, cost=Cost(100, 48))]


def test_fair_aborts_a_chunk_when_it_would_pause_and_the_chunk_has_more_than_the_bound_left() -> None:
    fair = Fair(quantum_ms=250, abort_ms=125)
    now = 1000.0
    chunk = Chunk(started=now - 1.0, ends=now + 3.0)  # 3 s left
    assert fair.abort_at(running(1.0, 4000), SHORT, chunk, now) == now  # past its quantum: at once
    assert fair.abort_at(running(0.1, 4000), SHORT, chunk, now) == pytest.approx(now + 0.15)  # when its quantum ends
    assert fair.abort_at(running(1.0, 4000), SHORT, Chunk(now - 1, INF), now) == now  # no prediction yet
    # a chunk that ends within the bound (from when it would be aborted) is finished: it pauses at its end
    assert fair.abort_at(running(1.0, 4000), SHORT, Chunk(now - 1, now + 0.125), now) == INF
    assert fair.abort_at(running(1.0, 4000), SHORT, Chunk(now - 1, now + 0.126), now) == now
    assert fair.abort_at(running(0.1, 4000), SHORT, Chunk(now - 1, now + 0.25), now) == INF  # quantum ends too late
    # what preempt would say no to
    assert fair.abort_at(running(1.0, 148), SHORT, chunk, now) == INF  # the waiting turn costs as much
    assert fair.abort_at(running(1.0, 296), SHORT, chunk, now) == INF  # not `similar` (2) times cheaper
    assert fair.abort_at(running(1.0, 297), SHORT, chunk, now) == now
    assert fair.abort_at(running(1.0, 4000), [], chunk, now) == INF
    assert fair.abort_at(running(1.0, 4000, sid="s"), SHORT, chunk, now) == INF  # its own session waits
    assert fair.abort_at(running(1.0, 4000, skips=4), SHORT, chunk, now) == INF
    # a chunk aborted max_aborts times runs to its end; a policy without aborts never aborts
    assert fair.abort_at(running(1.0, 4000), SHORT, Chunk(now - 1, now + 3, aborts=MAX_ABORTS - 1), now) == now
    assert fair.abort_at(running(1.0, 4000), SHORT, Chunk(now - 1, now + 3, aborts=MAX_ABORTS), now) == INF
    assert Fair(abort_ms=None).abort_at(running(1.0, 4000), SHORT, chunk, now) == INF
    assert Fair(abort_ms=INF).abort_at(running(1.0, 4000), SHORT, chunk, now) == INF


def test_prefill_abort_ms_by_name_config_and_cli() -> None:
    fair = make_policy("fair", prefill_abort_ms=250)
    assert isinstance(fair, Fair) and fair.abort_ms == 250 and fair.quantum_ms == 500
    default = make_policy("fair")
    assert isinstance(default, Fair) and default.abort_ms == PREFILL_ABORT_MS == 100
    never = make_policy("fair", prefill_abort_ms=INF)
    assert isinstance(never, Fair) and never.abort_ms is None
    assert RuntimeConfig.build(policy="fair", prefill_abort_ms=50).scheduler.prefill_abort_ms == 50
    for bad in (-1, True, "10", float("nan")):
        with pytest.raises(InvalidConfig, match="prefill_abort_ms"):
            RuntimeConfig.build(policy="fair", prefill_abort_ms=bad)
    with pytest.raises(InvalidConfig, match="prefill_abort_ms"):
        Fair(abort_ms=-5)
    args = build_parser().parse_args(["serve", "--policy", "fair", "--prefill-abort-ms", "inf"])
    assert args.prefill_abort_ms == INF
    assert build_parser().parse_args(["serve"]).prefill_abort_ms is None


def test_the_watch_predicts_a_chunk_from_this_requests_last_ones_and_counts_aborts() -> None:
    seen: list[tuple[Chunk, int, int]] = []

    def decide(chunk: Chunk, now: float, done: int, total: int) -> float:
        seen.append((chunk, done, total))
        return now + 5.0

    slot = SlotRate()
    w = ChunkAbort(decide, slot)
    assert w.at == INF
    w.started(0, 1000, 100)
    assert seen[-1][0].ends == INF and seen[-1][1:] == (0, 1000)  # nothing measured yet
    assert w.at > time.perf_counter()  # the policy's answer
    w.ended(True)
    assert w.at == INF  # between chunks nothing is aborted
    w.started(100, 1000, 100)
    c = seen[-1][0]
    assert c.started < c.ends < INF and c.aborts == 0
    # another request's first chunk: predicted from the slot's last one
    ChunkAbort(decide, slot).started(0, 50, 50)
    first = seen.pop()[0]
    assert first.ends - first.started == pytest.approx(50 * slot.last, rel=0.01) and slot.last > 0
    w.ended(False)
    w.started(100, 1000, 100)
    assert seen[-1][0].aborts == 1 and w.aborted == 1
    w.update()  # asked again during the chunk: the same chunk
    assert seen[-1][0] is seen[-2][0] and len(seen) == 4
    w.ended(True)
    w.update()  # between chunks: not asked
    assert len(seen) == 4 and w.at == INF
    # growing chunk times (a deeper KV cache): the next one is predicted to grow as much again
    w._rates = [0.001, 0.002]
    w.started(300, 1000, 100)
    c = seen[-1][0]
    assert c.ends - c.started == pytest.approx(100 * 0.002 * 2, rel=0.01)


class Chunks:
    """A job that plays a prefill of `total` tokens in `chunk`-token chunks through its chunk watch: the chunk at
    `done` tokens sets `starts[done]` and runs until `ends[done]` is set (then it is evaluated), or until the
    watch's time has come (then it is aborted and the job pauses, as the slot does when llama.cpp's abort check
    says so)."""

    def __init__(self, total: int, chunk: int) -> None:
        self.total, self.chunk = total, chunk
        self.done: dict[int, int] = {}
        self.runs: list[tuple[str, int, int, int]] = []  # (session, start, done, aborted)
        self.starts = {d: anyio.Event() for d in range(0, total, chunk)}
        self.ends = {d: anyio.Event() for d in range(0, total, chunk)}

    async def execute(self, job: Job[int]) -> int:
        start = done = self.done.get(job.id, 0)
        watch = job.chunks
        assert watch is not None
        while done < self.total:
            if done > start and job.pause_check is not None and job.pause_check(done, self.total):
                self.done[job.id] = done
                self.runs.append((job.session_id, start, done, 0))
                raise PrefillPaused(done, self.total, 0, done - start, 0.0, "none")
            n = min(self.chunk, self.total - done)
            watch.started(done, self.total, n)
            self.starts[done].set()
            while not self.ends[done].is_set():
                if time.perf_counter() >= watch.at:
                    watch.ended(False)
                    self.done[job.id] = done
                    self.runs.append((job.session_id, start, done, n))
                    raise PrefillPaused(done, self.total, 0, done - start, 0.0, "none", aborted_tokens=n)
                await anyio.lowlevel.checkpoint()
            watch.ended(True)
            done += n
        self.runs.append((job.session_id, start, done, 0))
        return done

    def finish(self) -> None:
        for end in self.ends.values():
            end.set()


async def short(job: Job[int]) -> int:
    return 1


async def test_a_request_arriving_during_a_chunk_aborts_it_and_the_chunk_runs_again_later() -> None:
    long = Chunks(total=300, chunk=100)
    sched = Scheduler(policy=Fair(quantum_ms=0, abort_ms=100))
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sched.run)
            job = sched.submit("long", long.execute, cost=Cost(300, 16))
            await long.starts[0].wait()
            assert job.chunks is not None and job.chunks.at == INF  # nobody waits
            s = sched.submit("s", short, cost=Cost(20, 16))  # the scheduler asks the policy again: abort now
            assert job.chunks.at <= time.perf_counter()
            assert await sched.wait(s) == 1
            long.finish()
            assert await sched.wait(job) == 300
            await sched.close()
    assert long.runs == [("long", 0, 0, 100), ("long", 0, 300, 0)]  # the first chunk aborted, then all of it
    st = sched.stats()
    assert (st.pauses, st.prefill_aborts, st.aborted_tokens) == (1, 1, 100)
    assert job.aborted_tokens == 100 and job.chunks.aborted == 1
    paused = [e for e in logs if e["event"] == "request.paused"]
    assert [(e["done"], e["aborted_tokens"]) for e in paused] == [(0, 100)]


async def test_a_chunk_near_its_end_is_finished_and_pauses_at_its_boundary() -> None:
    long = Chunks(total=300, chunk=100)
    sched = Scheduler(policy=Fair(quantum_ms=0, abort_ms=3_600_000))  # every chunk ends within the bound
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        job = sched.submit("long", long.execute, cost=Cost(300, 16))
        await long.starts[0].wait()
        long.ends[0].set()  # the first chunk is measured
        await long.starts[100].wait()  # the second: predicted from the first
        s = sched.submit("s", short, cost=Cost(20, 16))
        assert job.chunks is not None and job.chunks.at == INF  # it ends within the bound
        long.finish()
        assert await sched.wait(s) == 1
        assert await sched.wait(job) == 300
        await sched.close()
    assert long.runs == [("long", 0, 200, 0), ("long", 200, 300, 0)]  # paused at the boundary after it
    st = sched.stats()
    assert st.prefill_aborts == 0 and st.pauses == 1 and job.aborted_tokens == 0


async def test_fifo_has_no_chunk_watch() -> None:
    sched = Scheduler(policy="fifo")
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        job = sched.submit("s", short)
        assert await sched.wait(job) == 1
        await sched.close()
    assert job.chunks is None
