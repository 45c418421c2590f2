"""The one OS thread that runs a Runtime's slot work (every llama.cpp call), awaited from anyio.

Why one fixed thread and not anyio's worker pool behind a limiter of one: the pool hands each call to
whichever idle worker it has, so over time several threads run decodes. llama.cpp's CPU backend computes
each graph on an OpenMP team that belongs to the calling thread, and every thread that ever decoded keeps
its team alive. Once libgomp manages more threads than the machine has cores it throttles its spin-wait and
its threads sleep between graphs: on 2 cores a second thread that once decoded (and is still alive) cut
SmolLM2's decode from 71-84 to 48 tokens/s (`benchmarks/RESULTS.md`, "one slot thread"). One thread per
Runtime keeps one team.

Semantics are those of `anyio.to_thread.run_sync` without `abandon_on_cancel`: the call runs to its end
even if the awaiting task is cancelled meanwhile (the cancellation is delivered after it returns), in a
copy of the caller's context (so structlog's bound context variables reach the thread's log lines).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from runtime.loop.notify import thread_waker

__all__ = ["SlotThread"]

T = TypeVar("T")


class SlotThread:
    """A single long-lived worker thread; `run` awaits a function on it. Started on first use."""

    def __init__(self, name: str = "turnstile-slot") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        await anyio.lowlevel.checkpoint()
        done = anyio.Event()
        wake = thread_waker(done.set)
        ctx = contextvars.copy_context()
        fut: Future[T] = self._pool.submit(ctx.run, fn, *args)
        fut.add_done_callback(lambda _: wake())
        with anyio.CancelScope(shield=True):  # the work is never abandoned halfway
            await done.wait()
        return fut.result()

    def shutdown(self) -> None:
        """Let the thread end once its queue is empty (it holds llama.cpp's OpenMP team until then)."""
        self._pool.shutdown(wait=True)
