"""Wake an anyio task from a worker thread without blocking the thread (asyncio or trio)."""

from __future__ import annotations

from collections.abc import Callable

import anyio


def thread_waker(callback: Callable[[], None]) -> Callable[[], None]:
    """A function any thread may call to run `callback` soon on the current event loop; it never blocks."""
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: anyio's other backend, trio
        import trio

        token = trio.lowlevel.current_trio_token()
        return lambda: token.run_sync_soon(callback)

    def wake() -> None:
        loop.call_soon_threadsafe(callback)

    return wake


class Signal:
    """An edge-triggered wake-up a thread can fire; an async consumer waits for it.

    Wake-ups fired from a thread while one is still on its way to the loop are merged into it (a streaming
    decode fires one per token; a busy loop then gets one call, not a backlog). Nothing is lost: the pending
    flag is cleared on the loop before the event is set, so whatever the thread made ready before it found
    the flag set is there when the consumer wakes.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._pending = False  # a wake-up from a thread is scheduled and has not run yet
        self._wake = thread_waker(self._woken)

    def fire(self) -> None:
        self._event.set()

    def fire_from_thread(self) -> None:
        """Wake the consumer from any thread, never blocking; merged into a wake-up already on its way."""
        if not self._pending:
            self._pending = True
            self._wake()

    def _woken(self) -> None:
        self._pending = False
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()
