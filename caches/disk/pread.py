"""Reading a record's bytes straight into their places, several pieces at once, with their CRC-32s.

zlib.crc32 runs at 1-3.5 GB/s on one core and a copy out of the page cache at 5-9 GB/s, so a state read
one chunk after the other is bound by its checksum. Here the work is cut into pieces (a range of one
file, and the buffers it fills) that a small thread pool reads with `os.preadv` (positional: the threads
share no file offset) and checksums; both calls release the GIL. A record's CRC-32 is then the CRC-32s of
its pieces combined in order (`crc32_combine`, zlib's `crc32_combine` in Python), so the record format
and its checksum are unchanged.

Invariants:
- `gather` returns only once every call it was given has finished or was cancelled before it started: no
  buffer a caller handed in is written after `gather` returns, whatever failed (a failed read's buffer
  goes back to `caches.buffers.STATE_BUFFERS` and must not be written any more).
- `crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)`.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Generic, TypeVar

from runtime.errors import StateFormatError

__all__ = ["PIECE", "Batch", "crc32_combine", "gather", "pread_into", "read_crc"]

T = TypeVar("T")

PIECE = 4 << 20
"""Bytes of a whole record's payload one task reads and checksums."""
_IOV_MAX = 1024
_POLY = 0xEDB88320  # CRC-32 (zlib), reflected
_WORKERS = max(2, min(4, os.cpu_count() or 1))

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0


def _executor() -> ThreadPoolExecutor:
    """The readers' pool, made at first use (again in a forked child: a fork does not copy the threads)."""
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="turnstile-disk-read")
            _pool_pid = os.getpid()
        return _pool


class Batch(Generic[T]):
    """Calls run by a few pool threads, and by the caller in `wait`; `wait` (or `abandon`) before using or
    giving up what they fill.

    Each thread takes the next call not started yet, so the caller's thread works too once it waits
    (nothing waits idle for a pool thread busy elsewhere), and `abandon` stops the calls not started."""

    def __init__(self, calls: Sequence[Callable[[], T]], *, helpers: int = _WORKERS) -> None:
        self._calls = list(calls)
        self._results: list[T | None] = [None] * len(self._calls)
        self._errors: list[BaseException | None] = [None] * len(self._calls)
        self._next = 0
        self._lock = threading.Lock()
        n = min(helpers, len(self._calls) - 1)
        pool = _executor() if n > 0 else None
        self._helpers: list[Future[None]] = [pool.submit(self._drain) for _ in range(n)] if pool else []

    def _drain(self) -> None:
        calls = self._calls
        while True:
            with self._lock:
                i = self._next
                if i >= len(calls):
                    return
                self._next = i + 1
            try:
                self._results[i] = calls[i]()
            except BaseException as e:  # kept for `wait`, in order
                self._errors[i] = e

    def wait(self) -> list[T]:
        """Every call's result, in order, once all have finished; or the error of the first (in order)
        that raised, once all have finished."""
        self._drain()
        futures.wait(self._helpers)
        results, errors = self._results, self._errors
        self._release()
        for e in errors:
            if e is not None:
                raise e
        return results  # type: ignore[return-value]  # (every call returned)

    def stop(self) -> None:
        """Start no more calls (those running go on)."""
        with self._lock:
            self._next = 1 << 62  # (past any call)

    def abandon(self) -> None:
        """Start no more calls and wait for those running; results and errors are dropped."""
        self.stop()
        futures.wait(self._helpers)
        self._release()

    def _release(self) -> None:
        """Drop the calls, results and errors: a call (or an error's traceback) that refers back to its
        caller would otherwise make a cycle, and the buffers it fills would wait for the garbage collector
        instead of going back to the pool (`caches.buffers`) when their last view goes."""
        self._calls, self._results, self._errors = [], [], []


def gather(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run `calls` on the pool and in this thread, and wait for all: their results in order, or the error
    of the first (in order) that raised, once all have finished."""
    return Batch(calls).wait()


def pread_into(fd: int, pos: int, views: Sequence[memoryview]) -> None:
    """Fill `views` one after the other from `fd` at byte `pos` (no file offset used or moved);
    StateFormatError("truncated") if the file ends first."""
    views = [v for v in views if len(v)]  # (a vectored read of nothing reads 0 bytes, as at the end)
    i, off = 0, 0  # the next view to fill, and how much of it is filled
    while i < len(views):
        batch = [views[i][off:], *views[i + 1 : i + _IOV_MAX]]
        got = os.preadv(fd, batch, pos)
        if got <= 0:
            raise StateFormatError("truncated", f"a read at byte {pos} got {got}")
        pos += got
        while i < len(views) and got >= len(views[i]) - off:
            got -= len(views[i]) - off
            i, off = i + 1, 0
        off += got


def read_crc(fd: int, pos: int, view: memoryview, crc: int) -> int:
    """`view` filled from `fd` at `pos`, in pieces of `PIECE` read and checksummed on the pool; the crc
    continued over it."""
    n = len(view)
    if n <= PIECE:
        pread_into(fd, pos, [view])
        return zlib.crc32(view, crc)
    starts = range(0, n, PIECE)

    def piece(a: int) -> int:
        v = view[a : min(n, a + PIECE)]
        pread_into(fd, pos + a, [v])
        return zlib.crc32(v)

    crcs = gather([partial(piece, a) for a in starts])
    for a, c in zip(starts, crcs, strict=True):
        crc = crc32_combine(crc, c, min(n, a + PIECE) - a)
    return crc


# -- CRC-32 combination (zlib's crc32_combine: multiply by x^(8 * len2) modulo the polynomial) -------------


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial (reflected bit order, as zlib's multmodp)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return p


def _x2n_table() -> list[int]:
    table, p = [], 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()
_shift_cache: dict[int, int] = {}


def _x8nmodp(n: int) -> int:
    """x^(8n) modulo the polynomial."""
    got = _shift_cache.get(n)
    if got is not None:
        return got
    p, k, m = 1 << 31, 3, n  # x^0; start at x^(2^3) = x^8
    while m:
        if m & 1:
            p = _multmodp(_X2N[k & 31], p)
        m >>= 1
        k += 1
    if len(_shift_cache) < 256:
        _shift_cache[n] = p
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of A + B from crc1 = crc32(A), crc2 = crc32(B) and len2 = len(B)."""
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2
