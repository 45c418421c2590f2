"""The fair policy and preemptible prefill in the scheduler, without a model: plain decisions, real anyio tasks.

A job's `execute` here plays a prefill in chunks: between two chunks it asks the job's pause check (as the slot
does from its thread) and raises `PrefillPaused` when told to, resuming from where it stopped next time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest

from runtime.backend.protocol import DecodePaused, PrefillPaused
from runtime.config import RuntimeConfig
from runtime.errors import InvalidConfig
from runtime.log import capture_logs
from runtime.loop.policy import PREFILL_QUANTUM_MS, Cost, Fair, Running, make_policy
from runtime.loop.scheduler import Job, Scheduler
from runtime.loop.turn_kinds import Chat
from runtime.loop.turns import predicted_cost
from tests.support.policy_cases import C, running


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
    chat = Chat(message="x" * 400, overrides={"max_tokens": 48})
    assert predicted_cost(chat) == Cost(101, 48)
    assert predicted_cost(Chat(message="hi", overrides={})) == Cost(1, 0)


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


@dataclass
class G(C):
    decoding: bool = False


def test_fair_pauses_a_generation_after_its_quantum_for_a_first_token_only() -> None:
    fair = Fair(decode_quantum_ms=100)
    short = [G("s", 5, cost=Cost(100, 48))]  # first token in 100 / 32 + 1 steps
    gen = Running("g", 0.099, Cost(0, 40), 0, decoding=True)
    assert not fair.preempt(gen, short)  # inside its quantum
    gen = Running("g", 0.100, Cost(0, 40), 0, decoding=True)
    assert fair.preempt(gen, short)
    assert not fair.preempt(Running("g", 1.0, Cost(0, 4), 0, decoding=True), short)  # it ends sooner
    assert not fair.preempt(gen, [G("s", 5, cost=Cost(0, 30), decoding=True)])  # a paused generation waits
    assert not fair.preempt(gen, [G("s", 5, cost=Cost(6000, 48))])  # a long prompt: its first token is later
    assert not fair.preempt(Running("s", 1.0, Cost(0, 40), 0, decoding=True), short)  # its own session
    assert not Fair(decode_quantum_ms=None).preempt(gen, short)
    assert make_policy("fair", None, float("inf")).pauses_decode is False  # type: ignore[attr-defined]
    assert make_policy("fair", None, 20.0).decode_quantum_ms == 20.0  # type: ignore[attr-defined]
    with pytest.raises(InvalidConfig, match="decode_quantum_ms"):
        RuntimeConfig.build(policy="fair", decode_quantum_ms=-1)
    assert RuntimeConfig.build(decode_quantum_ms=float("inf")).scheduler.decode_quantum_ms == float("inf")


def test_fair_gives_first_tokens_before_paused_generations_and_those_before_a_long_prompt() -> None:
    long = G("long", 1, cost=Cost(5000, 48))
    gen = G("g", 2, cost=Cost(0, 40), decoding=True)
    fresh = G("s", 5, cost=Cost(100, 48))
    assert Fair().pick([long, gen, fresh], lambda c: 0) is fresh  # its first token comes sooner than gen's end
    assert Fair().pick([long, gen], lambda c: 0) is gen  # then the paused generation, before the long prompt
    assert Fair().pick([long, gen, G("d", 6, cost=Cost(3000, 48))], lambda c: 0) is gen
    assert Fair().pick([long, G("s", 5, cost=Cost(100, 48))], lambda c: 0).session_id == "s"  # as before
    gen.skips = long.skips = 4
    assert Fair().pick([long, gen, fresh], lambda c: 0) is long  # passed over max_skips times: oldest first


class Carried:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Decode:
    """Jobs that generate `total` tokens one at a time, asking the decode check after each (as the slot does)."""

    def __init__(self) -> None:
        self.done: dict[int, int] = {}
        self.runs: list[tuple[str, int, int]] = []
        self.carries: dict[int, Carried] = {}
        self.gate: anyio.Event | None = None
        self.started = anyio.Event()

    def work(self, total: int) -> Callable[[Job[int]], Awaitable[int]]:
        async def execute(job: Job[int]) -> int:
            start = done = self.done.get(job.id, 0)
            assert (job.carry is not None) == (start > 0)  # a resumed generation is handed its carry
            self.started.set()
            try:
                while done < total:
                    if self.gate is not None:
                        await self.gate.wait()
                    await anyio.lowlevel.checkpoint()
                    done += 1
                    if done < total and job.decode_check is not None and job.decode_check(done):
                        self.done[job.id] = done
                        carry = self.carries.setdefault(job.id, Carried())
                        raise DecodePaused(done, total, 0, 0, 0.0, "none", generated=done, t_decode=0.0, carry=carry)
            finally:
                self.runs.append((job.session_id, start, done))
            return done

        return execute


async def test_a_paused_generation_lets_first_tokens_through_and_goes_on_where_it_stopped() -> None:
    d = Decode()
    sched = Scheduler(policy=Fair(quantum_ms=0, decode_quantum_ms=0))
    d.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        reply = sched.submit("g", d.work(20), cost=Cost(10, 20))
        await d.started.wait()
        shorts = [sched.submit(f"s{i}", d.work(1), cost=Cost(100, 1)) for i in range(2)]
        gate, d.gate = d.gate, None
        gate.set()
        assert await sched.wait(reply) == 20
        assert [await sched.wait(j) for j in shorts] == [1, 1]
        await sched.close()
    assert d.runs == [("g", 0, 1), ("s0", 0, 1), ("s1", 0, 1), ("g", 1, 20)]
    assert [p.generated for p in reply.pauses] == [1] and reply.cost == Cost(0, 19) and reply.paused_s > 0
    st = sched.stats()
    assert (st.pauses, st.decode_pauses, st.completed) == (1, 1, 3)
    assert d.carries[reply.id].closed == 0  # it ran again: the slot frees it when the reply ends


async def test_a_generation_cancelled_while_paused_frees_its_carry_and_never_runs_again() -> None:
    d = Decode()
    sched = Scheduler(policy=Fair(quantum_ms=0, decode_quantum_ms=0))
    d.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        reply = sched.submit("g", d.work(20), cost=Cost(10, 20))
        await d.started.wait()
        d_short = Decode()
        d_short.gate = anyio.Event()
        short = sched.submit("s", d_short.work(1), cost=Cost(100, 1))
        gate, d.gate = d.gate, None
        gate.set()
        await d_short.started.wait()  # the reply is paused after its first token; the short turn runs
        assert reply.decoding and not reply.done.is_set() and len(sched) == 1
        await sched.withdraw(reply, "cancelled")
        assert reply.done.is_set() and d.carries[reply.id].closed == 1 and reply.carry is None
        d_short.gate.set()
        assert await sched.wait(short) == 1
        await sched.close()
    assert d.runs == [("g", 0, 1)]
    st = sched.stats()
    assert (st.cancelled, st.completed, st.decode_pauses, st.queued) == (1, 1, 1, 0)
