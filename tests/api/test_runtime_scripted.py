"""The Runtime over the scripted backend: queue, timeouts, close, cancellation and commits, sequenced with
gates (a turn held in the worker thread until the test opens it), no model and no sleeps."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import anyio
import pytest

from runtime import QueueFull, Reply, RequestTimeout, Runtime, RuntimeClosed
from runtime.testing import Gate, ScriptedBackend
from sessions import MemoryStore
from tests.conftest import Scripted


async def test_queue_full_is_immediate_and_creates_nothing(scripted: Scripted) -> None:
    async with scripted(max_queued=2) as (rt, backend), anyio.create_task_group() as tg:
        gate = backend.hold("a")
        tg.start_soon(rt.chat, "a", "runs")
        await gate.arrived()  # "a" runs: the queue is empty again
        tg.start_soon(rt.chat, "b", "queued one")
        tg.start_soon(rt.chat, "c", "queued two")
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(QueueFull):
            await rt.chat("d", "no room")
        assert rt.stats().scheduler.rejected == 1
        gate.open()
    assert not rt.store.exists("d")
    assert backend.runs == ["a", "b", "c"]


async def test_timeout_of_a_running_turn_leaves_no_trace(scripted: Scripted) -> None:
    async with scripted() as (rt, backend):
        await rt.chat("e", "before")
        before = rt.store.export("e")
        gate = backend.hold("e")
        with pytest.raises(RequestTimeout) as info:
            await rt.chat("e", "too slow", timeout=0.01)  # the gate is never opened: the turn is stopped
        assert isinstance(info.value, TimeoutError)
        assert rt.store.export("e") == before
        assert rt.stats().scheduler.timed_out == 1
        gate.open()
        assert (await rt.chat("e", "after")).text == "echo: after"


async def test_close_finishes_the_running_turn_and_fails_queued_ones(scripted: Scripted) -> None:
    failed: list[BaseException] = []

    async def victim(rt: Runtime) -> None:
        try:
            await rt.chat("g", "never runs")
        except RuntimeClosed as e:
            failed.append(e)

    async with scripted() as (rt, backend):
        gate = backend.hold("h")
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.chat, "h", "runs while closing")
            await gate.arrived()
            tg.start_soon(victim, rt)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(rt.aclose)
            await anyio.wait_all_tasks_blocked()
            gate.open()
        assert len(failed) == 1
        assert [m.content for m in rt.store.get("h").messages] == ["runs while closing", "echo: runs while closing"]
        assert not rt.store.exists("g")
        with pytest.raises(RuntimeClosed):
            await rt.chat("h", "after close")
    assert backend.closed


async def test_cancelled_queued_and_running_turns_leave_no_trace(scripted: Scripted) -> None:
    async with scripted() as (rt, backend):
        gate = backend.hold("run")
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.chat, "run", "held")
            await gate.arrived()
            with anyio.CancelScope() as queued:
                tg.start_soon(lambda: _cancel_soon(queued))
                await rt.chat("q", "queued then cancelled")
            tg.cancel_scope.cancel()  # the running one: stopped at its gate
        assert not rt.store.exists("q") and not rt.store.exists("run")
        st = rt.stats().scheduler
        assert (st.cancelled, st.completed) == (2, 0)
        assert backend.runs == ["run"]


async def _cancel_soon(scope: anyio.CancelScope) -> None:
    await anyio.wait_all_tasks_blocked()
    scope.cancel()


class GatedStore(MemoryStore):
    """A store whose commit waits at a gate before it writes (`before`) or after (`after`), in the worker thread."""

    def __init__(self) -> None:
        super().__init__()
        self.before: Gate | None = None
        self.after: Gate | None = None

    def commit(self, session: Any, **kw: Any) -> Any:
        if self.before is not None:
            self.before._wait(lambda: False)
        stored = super().commit(session, **kw)
        if self.after is not None:
            self.after._wait(lambda: False)
        return stored


@pytest.mark.parametrize("when", ["before", "after"])
async def test_cancel_during_commit_commits_nothing(when: str) -> None:
    """The caller leaves while its finished reply is being committed: before the write, or after it."""
    store = GatedStore()
    async with Runtime.serve(ScriptedBackend(), store) as rt:
        await rt.chat("c", "first")
        before = store.export("c")
        gate = Gate()
        setattr(store, when, gate)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def leave() -> None:
                    await gate.arrived()  # the reply is done; its commit waits at the gate
                    scope.cancel()
                    gate.open()

                tg.start_soon(leave)
                await rt.chat("c", "second")
                pytest.fail("the caller was cancelled")  # pragma: no cover
        assert scope.cancelled_caught
        assert store.export("c") == before  # the caller got an error: nothing of its turn is in the store
        setattr(store, when, None)
        assert (await rt.chat("c", "third")).revision == 2


async def test_a_stream_closed_before_its_reply_commits_nothing(scripted: Scripted) -> None:
    async with scripted() as (rt, _backend):
        async with aclosing(rt.stream("s", "one two three")) as it:
            async for item in it:
                assert item == "echo:"
                break
        assert not rt.store.exists("s")
        items = [x async for x in rt.stream("s", "one two")]
        assert items[:-1] == ["echo:", " one", " two"] and isinstance(items[-1], Reply)
        assert rt.store.get("s").revision == 1


async def test_the_event_loop_runs_while_a_turn_runs(scripted: Scripted) -> None:
    ticks = 0
    async with scripted() as (rt, backend), anyio.create_task_group() as tg:
        gate = backend.hold("t")
        tg.start_soon(rt.chat, "t", "long")
        await gate.arrived()  # the turn is inside the worker thread, holding it
        for _ in range(100):
            await anyio.lowlevel.checkpoint()
            ticks += 1
        gate.open()
    assert ticks == 100
