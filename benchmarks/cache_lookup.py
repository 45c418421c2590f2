"""Prefix lookup time: `LlamaRAMCache` (a linear scan) vs `LlamaTrieCache` (a token trie), by entry count.

Each cache holds N entries of `--tokens` tokens (states are small fakes with an `nbytes`). The keys
share a `--shared`-token prefix (a system prompt and common history, as conversations do) and end in
distinct tokens; each lookup is an existing key plus `--extra` new tokens (a returning conversation),
so every lookup is a hit in both caches. The trie's time should stay flat in N; the scan's grows.

    python -m benchmarks cache-lookup [--sizes 100,1000,10000] [--tokens 1000] [--lookups 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

from benchmarks._report import emit
from caches.llama_cache import BaseLlamaCache, LlamaRAMCache, LlamaTrieCache


class FakeState:
    """A stand-in for a LlamaState: only its size matters to the caches."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def make_keys(n: int, length: int, shared: int, rng: random.Random, vocab: int = 32_000) -> list[tuple[int, ...]]:
    prefix = [rng.randrange(vocab) for _ in range(shared)]
    keys: set[tuple[int, ...]] = set()
    while len(keys) < n:
        keys.add(tuple(prefix + [rng.randrange(vocab) for _ in range(length - shared)]))
    out = sorted(keys)
    rng.shuffle(out)
    return out


def time_lookups(cache: BaseLlamaCache, queries: Sequence[Sequence[int]]) -> list[float]:
    """Seconds per lookup, one per query."""
    times: list[float] = []
    for q in queries:
        t0 = time.perf_counter()
        cache[q]
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks cache-lookup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="100,1000,10000", help="entry counts, comma-separated")
    ap.add_argument("--tokens", type=int, default=1000, help="tokens per cached key")
    ap.add_argument("--shared", type=int, default=976, help="tokens all keys share at their start")
    ap.add_argument("--extra", type=int, default=50, help="new tokens after the cached key in each lookup")
    ap.add_argument("--lookups", type=int, default=30, help="RAM lookups per size (the trie does 10x)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not 0 <= args.shared < args.tokens:
        ap.error("--shared must be in 0..tokens-1")

    rng = random.Random(args.seed)
    rows: list[dict[str, object]] = []
    trie_best: list[float] = []
    for n in sizes:
        keys = make_keys(n, args.tokens, args.shared, rng)
        ram, trie = LlamaRAMCache(capacity_bytes=1 << 40), LlamaTrieCache(capacity_bytes=1 << 40)
        t0 = time.perf_counter()
        for k in keys:
            ram[k] = FakeState(1 << 20)  # type: ignore[assignment]
        ram_fill = time.perf_counter() - t0
        t0 = time.perf_counter()
        for k in keys:
            trie[k] = FakeState(1 << 20)  # type: ignore[assignment]
        trie_fill = time.perf_counter() - t0
        # the trie is cheap to query: 10x the lookups for a steadier median; both warm up first
        queries = [
            list(rng.choice(keys)) + [rng.randrange(32_000) for _ in range(args.extra)]
            for _ in range(10 * args.lookups)
        ]
        time_lookups(ram, queries[:3])
        ram_t = time_lookups(ram, queries[: args.lookups])
        time_lookups(trie, queries[:30])
        trie_t = time_lookups(trie, queries)
        ram_us, trie_us = statistics.median(ram_t) * 1e6, statistics.median(trie_t) * 1e6
        trie_best.append(min(trie_t) * 1e6)
        rows.append(
            {
                "entries": n,
                "ram_median_us": ram_us,
                "ram_min_us": min(ram_t) * 1e6,
                "trie_median_us": trie_us,
                "trie_min_us": trie_best[-1],
                "ram/trie": ram_us / trie_us,
                "ram_fill_s": ram_fill,
                "trie_fill_s": trie_fill,
            }
        )
        del ram, trie, keys
    flat = max(trie_best) / min(trie_best)
    emit(
        "cache-lookup",
        rows,
        params={
            "tokens": args.tokens,
            "shared": args.shared,
            "extra": args.extra,
            "lookups": args.lookups,
            "seed": args.seed,
            "trie_min_slowest_over_fastest": round(flat, 2),
        },
    )
    print(f"  trie lookup (min), slowest size over fastest: {flat:.2f}x (flat is ~1x; medians move with load)")
