"""Policies and the scheduler without a model: plain decisions, real anyio tasks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest

from runtime.errors import QueueFull
from runtime.loop.policy import Affinity, Fifo, make_policy
from runtime.loop.scheduler import Job, Scheduler


@dataclass
class C:
    session_id: str
    arrival: int
    skips: int = 0


def test_fifo_takes_the_oldest() -> None:
    cands = [C("b", 3), C("a", 1), C("c", 2)]
    assert Fifo().pick(cands, lambda c: 10 if c.session_id == "c" else 0).session_id == "a"


def test_affinity_prefers_state_at_hand_then_age_and_bounds_skips() -> None:
    cands = [C("a", 1), C("b", 2), C("c", 3)]
    score = {"a": 0, "b": 1, "c": 2}
    assert Affinity().pick(cands, lambda c: score[c.session_id]).session_id == "c"
    assert Affinity().pick(cands, lambda c: 1).session_id == "a"  # equal scores: oldest
    starved = [C("a", 1, skips=4), C("b", 2), C("c", 3, skips=4)]
    assert Affinity(max_skips=4).pick(starved, lambda c: score[c.session_id]).session_id == "a"


def test_policies_by_name() -> None:
    assert make_policy("fifo").name == "fifo"
    assert make_policy("affinity").name == "affinity"
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lifo")


async def test_scheduler_keeps_session_order_and_bounds_skips() -> None:
    ran: list[tuple[str, int]] = []
    sched = Scheduler(policy=Affinity(max_skips=2), max_queued=100, affinity=lambda sid: 2 if sid == "hot" else 0)

    def work(tag: int) -> Callable[[Job], Awaitable[int]]:
        async def execute(job: Job) -> int:
            ran.append((job.session_id, tag))
            await anyio.sleep(0)
            return tag

        return execute

    async with anyio.create_task_group() as tg:
        jobs = [sched.submit("cold", work(0))]
        jobs += [sched.submit("hot", work(i)) for i in range(1, 6)]
        jobs += [sched.submit("cold", work(6))]
        tg.start_soon(sched.run)
        results = [await sched.wait(j) for j in jobs]
        await sched.close()
    assert results == [0, 1, 2, 3, 4, 5, 6]
    assert [t for s, t in ran if s == "hot"] == [1, 2, 3, 4, 5]  # a session's turns in order
    assert [t for s, t in ran if s == "cold"] == [0, 6]
    assert ran.index(("cold", 0)) <= 2  # passed over at most twice
    assert sched.stats().max_skips == 2


async def test_queue_full_is_immediate() -> None:
    sched = Scheduler(max_queued=2)

    async def execute(_job: Job) -> None:
        return None

    sched.submit("a", execute)
    sched.submit("b", execute)
    with pytest.raises(QueueFull):
        sched.submit("c", execute)
    assert sched.stats().rejected == 1
