"""A running prefill's chunks as the scheduler sees them, and from when the running one is aborted.

The slot reports each chunk's start and end (`started`, `ended`, on its thread); the scheduler asks again
whenever the requests that could run next change (`update`, on the event loop). Either way the policy decides
synchronously (`Aborting.abort_at`) over the job, the waiting heads and the chunk, and the answer is one
number, `at`: llama.cpp's abort check reads it after every graph node and compares it with the clock, so the
check takes no lock and builds nothing. The two writers (slot thread and event loop) take a lock between
them; the reader never does.

A chunk's end is predicted from this request's previous chunk (seconds a token, times the growth from the
chunk before it: a chunk at a greater depth reads a longer KV cache); a request's first chunk from the last
chunk the slot evaluated for any request (`SlotRate`), and with none measured yet its end is unknown (inf).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from runtime.loop.policy import Chunk

__all__ = ["ChunkAbort", "SlotRate"]

NEVER = math.inf


class SlotRate:
    """Seconds a prompt token took in the last chunk the slot evaluated, any request's (0: none yet)."""

    def __init__(self) -> None:
        self.last = 0.0


class ChunkAbort:
    """One request's chunk watch (`runtime.backend.protocol.ChunkWatch`); `decide(chunk, now, done, total)` is
    the policy's answer for the job as it runs now."""

    def __init__(self, decide: Callable[[Chunk, float, int, int], float], slot: SlotRate | None = None) -> None:
        self.at = NEVER  # read by llama.cpp's abort check on the slot's thread
        self._decide = decide
        self._slot = slot if slot is not None else SlotRate()
        self._lock = threading.Lock()
        self._chunk: tuple[Chunk, int, int] | None = None  # the running chunk, its start and the prompt's length
        self._rates: list[float] = []  # seconds a token of this request's last two evaluated chunks
        self._tokens = 0
        self._aborts: dict[int, int] = {}  # chunk start -> times aborted
        self.aborted = 0  # chunks aborted (for a pause or a cancel)

    def started(self, done: int, total: int, tokens: int) -> None:
        now = time.perf_counter()
        rate = self._slot.last
        if self._rates:
            rate = self._rates[-1]
            if len(self._rates) > 1 and self._rates[0] > 0:
                rate *= max(1.0, self._rates[-1] / self._rates[0])
        ends = now + rate * tokens if rate > 0 else NEVER
        chunk = Chunk(now, ends, self._aborts.get(done, 0))
        self._tokens = tokens
        with self._lock:
            self._chunk = (chunk, done, total)
            self.at = self._decide(chunk, now, done, total)

    def ended(self, ok: bool) -> None:
        with self._lock:
            running, self._chunk = self._chunk, None
            self.at = NEVER
        if running is None:
            return
        chunk, done, _ = running
        if ok:
            rate = (time.perf_counter() - chunk.started) / max(1, self._tokens)
            self._rates = [*self._rates[-1:], rate]
            self._slot.last = rate
        else:
            self._aborts[done] = self._aborts.get(done, 0) + 1
            self.aborted += 1

    def update(self) -> None:
        """Ask the policy again (the waiting requests changed); nothing to do between chunks."""
        with self._lock:
            running = self._chunk
            if running is not None:
                chunk, done, total = running
                self.at = self._decide(chunk, time.perf_counter(), done, total)
