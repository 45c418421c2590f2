"""Signal: thread wake-ups that arrive while one is pending are merged, and none is lost."""

from __future__ import annotations

import threading

import anyio
import pytest

from runtime.loop.notify import Signal


@pytest.mark.anyio
async def test_wakeups_fired_while_one_is_pending_are_merged() -> None:
    sig = Signal()
    calls: list[int] = []
    real = sig._wake
    sig._wake = lambda: (calls.append(1), real())[1]  # count what reaches the loop
    items: list[int] = []

    def worker() -> None:  # the loop is blocked in this thread's join: every fire but the first is merged
        for i in range(100):
            items.append(i)
            sig.fire_from_thread()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    with anyio.fail_after(5):
        await sig.wait()
    assert items == list(range(100))
    assert calls == [1]
    # the next fire after the loop ran the wake-up is delivered again
    done = threading.Event()

    def again() -> None:
        items.append(100)
        sig.fire_from_thread()
        done.set()

    t = threading.Thread(target=again)
    t.start()
    with anyio.fail_after(5):
        await sig.wait()
    t.join()  # the loop may wake before the thread gets to `done.set()`
    assert done.is_set() and items[-1] == 100 and calls == [1, 1]
