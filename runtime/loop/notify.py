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
    """An edge-triggered wake-up a thread can fire; an async consumer waits for it."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self.fire_from_thread = thread_waker(self.fire)

    def fire(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()
