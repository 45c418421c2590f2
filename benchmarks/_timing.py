"""Timing one call again and again, for the benchmarks that time small operations (a render, a state save or
load, a decode step): each run's seconds, or their median or (min, median) in milliseconds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["median_ms", "min_median_ms", "times_s"]


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
