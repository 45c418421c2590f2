"""Timing one call again and again, for the benchmarks that time small operations (a render, a state save or
load, a decode step): each run's seconds, or their median or (min, median) in milliseconds; and the speed
columns of an operation that moves a number of bytes (`throughput`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["median_ms", "min_median_ms", "throughput", "times_s"]


def times_s(fn: Callable[..., object], repeat: int, before: Callable[..., object] | None = None) -> list[float]:
    """The seconds each of `repeat` calls of `fn` took (`before` runs untimed before each)."""
    out: list[float] = []
    for _ in range(repeat):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def median_ms(fn: Callable[..., object], repeat: int) -> float:
    """The median milliseconds of `fn` over `repeat` calls."""
    return statistics.median(times_s(fn, repeat)) * 1000


def min_median_ms(
    fn: Callable[..., object], repeat: int, before: Callable[..., object] | None = None
) -> tuple[float, float]:
    """(min, median) milliseconds of `fn` over `repeat` calls (`before` runs untimed before each)."""
    times = times_s(fn, repeat, before)
    return min(times) * 1000, statistics.median(times) * 1000


def throughput(nbytes: int, times: list[float], memcpy_s: float | None) -> dict[str, Any]:
    """The columns of an operation that moved `nbytes` in each of `times` (seconds): MB, median and best ms and
    GB/s, the median against `memcpy_s` (a memcpy of the same bytes; 1.0 without one) and every time in ms."""
    med, best = statistics.median(times), min(times)
    return {
        "MB": round(nbytes / 1e6, 1),
        "median_ms": round(1000 * med, 2),
        "best_ms": round(1000 * best, 2),
        "GB_s": round(nbytes / med / 1e9, 2),
        "best_GB_s": round(nbytes / best / 1e9, 2),
        "x_memcpy": round(med / memcpy_s, 2) if memcpy_s else 1.0,
        "times_ms": [round(1000 * t, 2) for t in times],
    }
