"""Large byte buffers for slot states, reused once nobody refers to them.

A state swap should cost one memory copy, but on a virtual machine touching fresh memory for the first
time often costs more than the copy itself (a page fault per 4 KiB page, or a compaction stall for a
huge page): filling a freshly allocated 140 MB buffer runs at 0.1-0.9 GB/s where a copy into memory
already mapped runs at 2.5-8 GB/s. A prompt cache at its limit frees a state for every state it saves
(an eviction, a state loaded from disk and restored), so `BufferPool` hands the memory of a freed
buffer to the next caller instead of returning it to the OS.

A buffer is free when nothing refers to it but the pool: every view of it (`memoryview` slices,
`numpy.frombuffer`) holds a reference to it, so its reference count says so. Buffers come back
uninitialised (they may hold old bytes): callers fill all of them. Thread-safe.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["MIN_POOLED", "STATE_BUFFERS", "BufferPool"]

MIN_POOLED = 1 << 20
"""Smaller buffers are plain allocations (cheap to make, not worth tracking)."""


class BufferPool:
    """Hands out writable byte views of at least `min_pooled` bytes, reusing the memory of freed ones.

    A free buffer is reused for a request of `n` bytes when its capacity is in `[n, n * (1 + slack)]`
    (so a cache's byte count, which counts `n`, is low by at most `slack`); at most `keep` free buffers
    are kept (the least recently used go back to the OS first). A cache at its limit frees about one
    state per state it makes, so two cover a swap (save + load) and the idle memory stays below what
    the transient copies of a swap used to take.
    """

    def __init__(self, keep: int = 2, *, slack: float = 0.125, min_pooled: int = MIN_POOLED) -> None:
        self.keep = keep
        self.slack = slack
        self.min_pooled = min_pooled
        self._lock = threading.Lock()
        self._bufs: list[np.ndarray[tuple[int], np.dtype[np.uint8]]] = []
        self.reused = 0
        self.allocated = 0

    def _free(self) -> list[np.ndarray[tuple[int], np.dtype[np.uint8]]]:
        """Lock held. The buffers nobody refers to, oldest first."""
        # a free buffer's references: the pool's list, the comprehension's variable, getrefcount's argument
        return [b for b in self._bufs if sys.getrefcount(b) <= 3]

    def take(self, n: int) -> memoryview:
        """A writable view of `n` uninitialised bytes (format "B")."""
        if n < self.min_pooled:
            return np.empty(n, dtype=np.uint8).data
        with self._lock:
            free = self._free()
            fits = [b for b in free if n <= b.size <= n * (1 + self.slack)]
            if fits:
                buf = min(fits, key=lambda b: b.size)
                self._bufs = [b for b in self._bufs if b is not buf]
                free = [b for b in free if b is not buf]
                self.reused += 1
            else:
                buf = np.empty(n, dtype=np.uint8)
                self.allocated += 1
            self._bufs.append(buf)  # the most recently used last
            drop = [id(b) for b in free[: max(0, len(free) - self.keep)]]  # the oldest go back to the OS
            if drop:
                self._bufs = [b for b in self._bufs if id(b) not in drop]
            del free, fits
            return buf.data[:n]

    def idle_bytes(self) -> int:
        """Bytes of the free buffers kept for reuse."""
        with self._lock:
            return sum(b.size for b in self._free())


STATE_BUFFERS = BufferPool()
"""The pool that `Engine.state_get` and the disk tier's reads share."""
