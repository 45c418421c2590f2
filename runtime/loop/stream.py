"""Streaming: text pieces handed from the worker thread to an async consumer without blocking the thread."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator

import anyio

from runtime.loop.notify import Signal
from runtime.loop.scheduler import Job, Scheduler
from runtime.reply import Reply


class Pieces:
    """A queue of text pieces: the worker thread pushes, the consumer is woken on the event loop."""

    def __init__(self) -> None:
        self.items: deque[str] = deque()
        self.signal = Signal()

    def push(self, piece: str) -> None:  # worker thread
        self.items.append(piece)
        self.signal.fire_from_thread()


async def follow(
    scheduler: Scheduler, job: Job[Reply], pieces: Pieces, timeout: float | None
) -> AsyncIterator[str | Reply]:
    """Yield a job's pieces as they come, then its Reply. A consumer that stops before it got the Reply
    (closed the iterator, was cancelled, timed out) withdraws the job: it is stopped and nothing is committed."""
    job.watchers.append(pieces.signal.fire)
    deadline = None if timeout is None else time.monotonic() + timeout
    delivered = False
    try:
        while True:
            while pieces.items:
                yield pieces.items.popleft()
            if job.done.is_set():
                break
            with anyio.move_on_after(None if deadline is None else max(0.0, deadline - time.monotonic())):
                await pieces.signal.wait()
                continue
            break  # the deadline passed
        while pieces.items:
            yield pieces.items.popleft()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        reply = await scheduler.wait(job, remaining)
        delivered = True
        yield reply
    finally:
        if not delivered:
            with anyio.CancelScope(shield=True):
                await scheduler.withdraw(job, "stream closed")
