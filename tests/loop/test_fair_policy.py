"""The fair policy and preemptible prefill in the scheduler, without a model: plain decisions, real anyio tasks.

A job's `execute` here plays a prefill in chunks: between two chunks it asks the job's pause check (as the slot
does from its thread) and raises `PrefillPaused` when told to, resuming from where it stopped next time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pytest

from runtime.backend.protocol import PrefillPaused
from runtime.config import RuntimeConfig
from runtime.errors import InvalidConfig
from runtime.log import capture_logs
from runtime.loop.policy import PREFILL_QUANTUM_MS, Cost, Fair, Running, make_policy
from runtime.loop.scheduler import Job, Scheduler
from runtime.loop.turns import Turn, predicted_cost
from runtime.types import RequestKind


@dataclass
class C:
    session_id: str
    arrival: int
    skips: int = 0
    cost: Cost = field(default_factory=Cost)


def running(held_s: float, left: int, skips: int = 0, sid: str = "long") -> Running:
    return Running(sid, held_s, Cost(left, 0), skips)


def test_fair_picks_the_cheapest_then_the_oldest_and_bounds_skips() -> None:
    cands = [C("a", 1, cost=Cost(5000, 48)), C("b", 2, cost=Cost(200, 48)), C("c", 3, cost=Cost(20, 48))]
    assert Fair().pick(cands, lambda c: 0).session_id == "c"
    assert Fair().pick([C("x", 2, cost=Cost(1)), C("y", 1, cost=Cost(1))], lambda c: 0).session_id == "y"
    # about the same size (within 2x of the cheapest): arrival order
    similar = [C("x", 3, cost=Cost(60, 48)), C("y", 2, cost=Cost(150, 48)), C("z", 1, cost=Cost(170, 48))]
    assert Fair().pick(similar, lambda c: 0).session_id == "y"
    assert Fair(similar=1).pick(similar, lambda c: 0).session_id == "x"
    cands[0].skips = 4
    assert Fair(max_skips=4).pick(cands, lambda c: 0).session_id == "a"  # passed over 4 times: it runs now
    assert Fair(max_skips=5).pick(cands, lambda c: 0).session_id == "c"


def test_fair_preempts_after_its_quantum_for_a_cheaper_waiting_request_only() -> None:
    fair = Fair(quantum_ms=250, max_skips=3)
    short = [C("s", 5, cost=Cost(100, 48))]
    assert not fair.preempt(running(0.249, 4000), short)  # inside its quantum
    assert fair.preempt(running(0.250, 4000), short)
    assert not fair.preempt(running(1.0, 148), short)  # what it has left is no more than the waiting turn
    assert fair.preempt(running(1.0, 149), short)
    assert not fair.preempt(running(1.0, 4000), [])  # nobody waits
    assert not fair.preempt(running(1.0, 4000, sid="s"), short)  # its own session's next turn waits behind it
    assert not fair.preempt(running(1.0, 4000, skips=3), short)  # passed over max_skips times: not again


def test_fair_by_name_and_options() -> None:
    assert make_policy("fair").name == "fair"
    fair = make_policy("fair", 120.0)
    assert isinstance(fair, Fair) and fair.quantum_ms == 120.0
    assert isinstance(make_policy("fair"), Fair) and Fair().quantum_ms == PREFILL_QUANTUM_MS
    assert RuntimeConfig.build(policy="fair", prefill_quantum_ms=50).scheduler.prefill_quantum_ms == 50
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(InvalidConfig, match="prefill_quantum_ms"):
            RuntimeConfig.build(policy="fair", prefill_quantum_ms=bad)
    with pytest.raises(InvalidConfig):
        Fair(quantum_ms=-1)


def test_serve_takes_policy_fair_and_its_quantum() -> None:
    from runtime.cli import build_parser

    args = build_parser().parse_args(["serve", "--policy", "fair", "--prefill-quantum-ms", "200"])
    assert (args.policy, args.prefill_quantum_ms) == ("fair", 200.0)
    assert build_parser().parse_args(["serve"]).prefill_quantum_ms is None


def test_predicted_cost_counts_what_is_new_and_max_tokens() -> None:
    chat = Turn(RequestKind.CHAT, "x" * 400, {"max_tokens": 48})
    assert predicted_cost(chat) == Cost(101, 48)
    assert predicted_cost(Turn(RequestKind.CHAT, "hi", {})) == Cost(1, 0)


class Prefill:
    """Jobs that prefill `total` tokens in chunks of `chunk`; each chunk waits for a gate when one is set."""

    def __init__(self, chunk: int = 100) -> None:
        self.chunk = chunk
        self.done: dict[int, int] = {}
        self.runs: list[tuple[str, int, int]] = []  # (session, start, end) of each run
        self.gate: anyio.Event | None = None
        self.started = anyio.Event()

    def work(self, total: int) -> Callable[[Job[int]], Awaitable[int]]:
        async def execute(job: Job[int]) -> int:
            start = done = self.done.get(job.id, 0)
            self.started.set()
            try:
                while done < total:
                    if done > start and job.pause_check is not None and job.pause_check(done, total):
                        self.done[job.id] = done
                        raise PrefillPaused(done, total, start if not job.pauses else 0, done - start, 0.0, "none")
                    if self.gate is not None:
                        await self.gate.wait()
                    await anyio.lowlevel.checkpoint()
                    done = min(total, done + self.chunk)
            finally:
                self.runs.append((job.session_id, start, done))
            return done

        return execute


async def test_a_paused_prefill_lets_short_turns_run_and_resumes_where_it_stopped() -> None:
    p = Prefill()
    sched = Scheduler(policy=Fair(quantum_ms=0, max_skips=4))
    p.gate = anyio.Event()
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sched.run)
            long = sched.submit("long", p.work(1000), cost=Cost(1000, 48))
            await p.started.wait()  # the long prefill holds the slot
            shorts = [sched.submit(f"s{i}", p.work(100), cost=Cost(100, 48)) for i in range(2)]
            after = sched.submit("long", p.work(100), cost=Cost(10, 0))  # its session's next turn
            gate, p.gate = p.gate, None
            gate.set()
            assert await sched.wait(long) == 1000
            assert [await sched.wait(j) for j in shorts] == [100, 100]
            assert await sched.wait(after) == 100
            await sched.close()
    # one chunk, then the short turns (each whole), then the rest from 100; its session's next turn after it
    assert p.runs == [("long", 0, 100), ("s0", 0, 100), ("s1", 0, 100), ("long", 100, 1000), ("long", 0, 100)]
    assert [j.arrival for j in shorts] == [2, 3] and long.arrival == 1
    assert len(long.pauses) == 1 and long.pauses[0].done == 100 and long.paused_s > 0
    assert long.started is not None and long.cost == Cost(900, 48)
    assert sched.stats().pauses == 1 and sched.stats().completed == 4
    paused = [e for e in logs if e["event"] == "request.paused"]
    resumed = [e for e in logs if e["event"] == "request.resumed"]
    assert [(e["request_id"], e["done"], e["total"]) for e in paused] == [(long.id, 100, 1000)]
    assert [(e["request_id"], e["done"]) for e in resumed] == [(long.id, 100)]


async def test_a_paused_prefill_waits_for_at_most_max_skips_others_between_its_quanta() -> None:
    p = Prefill()
    sched = Scheduler(policy=Fair(quantum_ms=0, max_skips=2))
    p.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        long = sched.submit("long", p.work(500), cost=Cost(500, 0))
        await p.started.wait()
        shorts = [sched.submit(f"s{i}", p.work(50), cost=Cost(50, 0)) for i in range(5)]
        gate, p.gate = p.gate, None
        gate.set()
        assert await sched.wait(long) == 500
        for j in shorts:
            await sched.wait(j)
        await sched.close()
    order = [sid for sid, _, _ in p.runs]
    assert order == ["long", "s0", "s1", "long", "s2", "s3", "long", "s4", "long"]
    # every run of the long prefill started where the last one stopped: nothing done twice
    spans = [(a, b) for sid, a, b in p.runs if sid == "long"]
    assert spans == [(0, 100), (100, 200), (200, 300), (300, 500)]
    assert sched.stats().max_skips == 2


async def test_fifo_never_pauses() -> None:
    p = Prefill()
    sched = Scheduler(policy="fifo")
    p.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        long = sched.submit("long", p.work(500))
        await p.started.wait()
        short = sched.submit("s", p.work(50))
        assert long.pause_check is None
        gate, p.gate = p.gate, None
        gate.set()
        await sched.wait(short)
        await sched.close()
    assert p.runs == [("long", 0, 500), ("s", 0, 50)]
    assert sched.stats().pauses == 0


async def test_a_request_cancelled_while_paused_leaves_the_queue_and_never_runs_again() -> None:
    p = Prefill()
    sched = Scheduler(policy=Fair(quantum_ms=0))
    p.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        long = sched.submit("long", p.work(1000), cost=Cost(1000, 0))
        await p.started.wait()
        short_gate = anyio.Event()
        p_short = Prefill()
        p_short.gate = short_gate
        short = sched.submit("s", p_short.work(100), cost=Cost(100, 0))
        gate, p.gate = p.gate, None
        gate.set()
        await p_short.started.wait()  # the long one is paused, back in the queue; the short one runs
        assert long.pauses and not long.done.is_set() and len(sched) == 1
        await sched.withdraw(long, "cancelled")
        assert long.done.is_set() and len(sched) == 0
        short_gate.set()
        assert await sched.wait(short) == 100
        await sched.close()
    assert p.runs == [("long", 0, 100)]  # never resumed
    st = sched.stats()
    assert (st.cancelled, st.completed, st.pauses, st.queued) == (1, 1, 1, 0)
