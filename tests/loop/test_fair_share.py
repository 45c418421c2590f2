"""Fair share across keys (runtime.loop.fair) in the real scheduler, with scripted jobs and real anyio tasks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from runtime.errors import InvalidConfig
from runtime.loop.fair import KeyShare, namespace_of
from runtime.loop.policy import Affinity
from runtime.loop.scheduler import Job, Scheduler


def test_namespace_is_the_text_before_the_first_at() -> None:
    assert namespace_of("alice@conv-1") == "alice"
    assert namespace_of("alice@a@b") == "alice"
    assert namespace_of("plain") == ""
    assert namespace_of("@stateless:3") == ""


def test_weighted_round_robin_in_the_ratio_of_the_weights() -> None:
    share = KeyShare({"a": 3, "b": 1}.__getitem__)
    order = [share.pick([("a", 1), ("b", 2)]) for _ in range(8)]
    assert order.count("a") == 6 and order.count("b") == 2
    assert order[:4] == ["a", "b", "a", "a"]  # equal starts: the oldest request first, then by weight


def test_an_idle_key_banks_no_credit() -> None:
    share = KeyShare()
    for _ in range(50):
        assert share.pick([("a", 1)]) == "a"
    # b arrives after a ran 50 times alone: it gets the next turn, then they alternate
    assert [share.pick([("a", 1), ("b", 99)]) for _ in range(4)] == ["b", "a", "b", "a"]


def test_bad_weight_is_refused() -> None:
    with pytest.raises(InvalidConfig, match="weight"):
        KeyShare(lambda _k: 0).pick([("a", 1)])


async def test_one_keys_backlog_delays_another_by_at_most_the_running_request() -> None:
    ran: list[str] = []
    first_running, release_first = anyio.Event(), anyio.Event()
    sched = Scheduler(policy="fifo", max_queued=1000)

    def work(label: str) -> Callable[[Job[str]], Awaitable[str]]:
        async def execute(_job: Job[str]) -> str:
            ran.append(label)
            if label == "a0":
                first_running.set()
                await release_first.wait()
            return label

        return execute

    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        # key A: 100 requests over 100 sessions (and a second request on one of them)
        jobs = [sched.submit(f"A@s{i}", work(f"a{i}")) for i in range(100)]
        await first_running.wait()  # a0 runs; 99 of A's wait
        assert len(sched) == 99
        b = sched.submit("B@only", work("b"))
        release_first.set()
        assert await sched.wait(b) == "b"
        for j in jobs:
            await sched.wait(j)
        await sched.close()
    assert ran[:2] == ["a0", "b"]  # B's single request ran right after the one running when it arrived
    assert sorted(ran) == sorted([f"a{i}" for i in range(100)] + ["b"])


async def test_the_policy_chooses_within_the_chosen_key() -> None:
    ran: list[str] = []
    gate = anyio.Event()
    hot = {"A@hot", "B@hot"}
    sched = Scheduler(policy=Affinity(max_skips=100), affinity=lambda sid: 2 if sid in hot else 0)

    def work(label: str) -> Callable[[Job[str]], Awaitable[str]]:
        async def execute(_job: Job[str]) -> str:
            ran.append(label)
            if label == "gate":
                await gate.wait()
            return label

        return execute

    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        first = sched.submit("C@x", work("gate"))
        await anyio.lowlevel.checkpoint()
        jobs = [
            sched.submit("A@cold", work("A cold")),
            sched.submit("A@hot", work("A hot")),
            sched.submit("B@cold", work("B cold")),
            sched.submit("B@hot", work("B hot")),
        ]
        gate.set()
        for j in [first, *jobs]:
            await sched.wait(j)
        await sched.close()
    # keys alternate (A was first to wait), and within each key the affinity policy takes its hot session
    assert ran == ["gate", "A hot", "B hot", "A cold", "B cold"]
