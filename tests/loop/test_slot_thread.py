"""SlotThread: every slot call of a Runtime runs on one and the same thread (llama.cpp's OpenMP team
belongs to the calling thread), the caller's context goes with it, and a cancelled caller never abandons
a call halfway."""

from __future__ import annotations

import contextvars
import threading

import anyio
import pytest

from runtime import Runtime
from runtime.backend.protocol import SlotRequest, SlotResult
from runtime.loop.slot_thread import SlotThread
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

pytestmark = pytest.mark.anyio

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="unset")


async def test_calls_share_one_thread_and_the_callers_context() -> None:
    st = SlotThread()
    try:
        _VAR.set("from the caller")
        seen = [await st.run(lambda: (threading.get_ident(), _VAR.get())) for _ in range(5)]
    finally:
        st.shutdown()
    assert len({ident for ident, _ in seen}) == 1
    assert seen[0][0] != threading.get_ident()
    assert {value for _, value in seen} == {"from the caller"}
    with pytest.raises(RuntimeError):  # shut down: the thread (and its OpenMP team) is gone
        st._pool.submit(lambda: None)


async def test_a_cancelled_caller_waits_for_the_call_to_finish() -> None:
    st = SlotThread()
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def work() -> str:
        started.set()
        release.wait()
        finished.append("done")
        return "result"

    try:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def caller() -> None:
                    await st.run(work)

                tg.start_soon(caller)
                await anyio.to_thread.run_sync(started.wait)
                scope.cancel()  # the caller is cancelled while the call runs...
                assert finished == []
                release.set()
        assert scope.cancelled_caught
        assert finished == ["done"]  # ...and the call ran to its end before the cancellation went through
    finally:
        st.shutdown()


class _Recording(ScriptedBackend):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def run(self, req: SlotRequest) -> SlotResult:
        self.threads.append(threading.get_ident())
        return super().run(req)

    def settle(self) -> None:
        self.threads.append(threading.get_ident())
        super().settle()


async def test_a_runtime_runs_every_turn_on_one_thread() -> None:
    backend = _Recording()
    async with Runtime.serve(backend, MemoryStore()) as rt:
        await rt.chat("a", "one")
        # anyio's pool gives its most recently idle worker to the next call: occupy it (as an HTTP route's
        # to_thread work would), so a pool-based slot call would land on another thread
        started, release = threading.Event(), threading.Event()

        def busy() -> None:
            started.set()
            release.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, busy)
            await anyio.to_thread.run_sync(started.wait)
            await rt.chat("b", "two")
            await rt.chat("a", "three")
            release.set()
    assert len(backend.threads) >= 3
    assert len(set(backend.threads)) == 1
    assert threading.get_ident() not in backend.threads
