"""`python -m benchmarks many-sessions`: the disk tier with many stored conversations.

Each row fills a fresh `DiskTier` with N conversations that share a system prompt (`--system` tokens)
and differ after it (a user part of 50-400 tokens), each with a tiny payload (`--payload` bytes), then
times `--samples` finds (a stored conversation coming back with a new message: the prompt is its
tokens plus 30 new ones) and `--samples` puts (new conversations), and the open of a second tier on
the filled directory (which loads the index). `fill_s` is the time to fill N: linear if a put costs
the same whatever N. `scan_ms` is the reference rule (`scan_rank`, a scan over every entry, what
`find` cost before the index) on the same prompts, for comparison.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import tempfile
import time
from pathlib import Path

import structlog

from benchmarks._report import emit
from caches.disk.index import scan_rank
from caches.disk.tier import DiskTier


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _conversation(rng: random.Random, system: list[int]) -> list[int]:
    return system + [rng.randrange(32_000) for _ in range(rng.randint(50, 400))]


def _run(directory: Path, n: int, samples: int, system_len: int, payload_size: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    system = [rng.randrange(32_000) for _ in range(system_len)]
    data = rng.randbytes(payload_size)
    stored = [_conversation(rng, system) for _ in range(n)]
    with DiskTier(directory, fingerprint="bench", settings="n_ctx=8192", limit_bytes=0) as tier:
        t0 = time.perf_counter()
        for tokens in stored:
            if not tier.put(tokens, data):
                raise RuntimeError("put refused")
        fill = time.perf_counter() - t0
        back = [rng.choice(stored) for _ in range(samples)]
        prompts = [[*tokens, *(rng.randrange(32_000) for _ in range(30))] for tokens in back]
        finds: list[float] = []
        for tokens, prompt in zip(back, prompts, strict=True):
            t0 = time.perf_counter()
            got = tier.find(prompt)
            finds.append(time.perf_counter() - t0)
            if got is None or got[0] != tokens:
                raise RuntimeError("find chose another entry")
        puts: list[float] = []
        for _ in range(samples):
            tokens = _conversation(rng, system)
            t0 = time.perf_counter()
            tier.put(tokens, data)
            puts.append(time.perf_counter() - t0)
        entries = [(d, item.tokens) for d, item in tier._m.items.items()]
        scans: list[float] = []
        for prompt in prompts[: max(1, min(samples, 20))]:
            want = tuple(prompt)
            t0 = time.perf_counter()
            scan_rank(entries, want)
            scans.append(time.perf_counter() - t0)
        nbytes = tier.nbytes
    t0 = time.perf_counter()
    with DiskTier(directory, fingerprint="bench", settings="n_ctx=8192", limit_bytes=0) as again:
        opened = time.perf_counter() - t0
        if len(again) != n + samples:
            raise RuntimeError("the reopened tier lost entries")
    return {
        "stored": n,
        "find_p50_ms": _pct(finds, 0.5),
        "find_p99_ms": _pct(finds, 0.99),
        "put_p50_ms": _pct(puts, 0.5),
        "put_p99_ms": _pct(puts, 0.99),
        "open_ms": 1000 * opened,
        "fill_s": fill,
        "fill_per_put_ms": 1000 * fill / n,
        "scan_ms": 1000 * statistics.median(scans),
        "MiB": nbytes / (1 << 20),
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks many-sessions", description=__doc__)
    ap.add_argument("--sizes", default="100,1000,10000", help="stored conversations per row, comma-separated")
    ap.add_argument("--samples", type=int, default=200, help="timed finds and puts per row")
    ap.add_argument("--system", type=int, default=600, help="tokens of the shared system prompt")
    ap.add_argument("--payload", type=int, default=4096, help="payload bytes per entry")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="where to put the tiers (default: a temporary directory)")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write many-sessions.json")
    args = ap.parse_args(argv)
    if not structlog.is_configured():  # the tier logs every put and hit at debug level
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-", dir=args.dir) as tmp:
        for n in sizes:
            rows.append(_run(Path(tmp) / f"n{n}", n, args.samples, args.system, args.payload, args.seed))
    emit(
        "many-sessions",
        rows,
        params={
            "samples": args.samples,
            "system_tokens": args.system,
            "payload_bytes": args.payload,
            "dir": args.dir or tempfile.gettempdir(),
        },
        out=Path(args.out) / "many-sessions.json" if args.out else None,
    )
