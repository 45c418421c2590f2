"""`python -m benchmarks disk-tier`: the disk tier's write and read throughput for slot-sized payloads.

Each row puts `--repeat` entries of one payload size into a fresh `DiskTier` (encode + CRC-32 + file
write + index, in one transaction), then finds each one again (index lookup + file read + checks).
Reads come from the page cache (the files were just written); no fsync is done on write, as diskcache
does none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks._report import emit
from caches.disk.tier import DiskTier

MIB = 1 << 20


def _run(directory: Path, size_mib: int, repeat: int, n_tokens: int) -> dict[str, object]:
    payloads = [os.urandom(size_mib * MIB) for _ in range(repeat)]
    prompts = [list(range(i * 1_000_000, i * 1_000_000 + n_tokens)) for i in range(repeat)]
    writes: list[float] = []
    reads: list[float] = []
    with DiskTier(directory / f"{size_mib}mib", fingerprint="bench", settings="n_ctx=8192", limit_bytes=0) as tier:
        for tokens, data in zip(prompts, payloads, strict=True):
            t0 = time.perf_counter()
            if not tier.put(tokens, data):
                raise RuntimeError("put refused")
            writes.append(time.perf_counter() - t0)
        for tokens, data in zip(prompts, payloads, strict=True):
            t0 = time.perf_counter()
            got = tier.find(tokens)
            reads.append(time.perf_counter() - t0)
            if got is None or got[1] != data:
                raise RuntimeError("find lost an entry")
        stats = tier.stats()
    w, r = statistics.median(writes), statistics.median(reads)
    return {
        "payload_MiB": size_mib,
        "n": repeat,
        "write_ms": 1000 * w,
        "write_MiB_s": size_mib / w,
        "read_ms": 1000 * r,
        "read_MiB_s": size_mib / r,
        "bytes_on_disk": stats.bytes,
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks disk-tier", description=__doc__)
    ap.add_argument("--sizes", default="1,8,32", help="payload sizes in MiB, comma-separated")
    ap.add_argument("--repeat", type=int, default=5, help="entries per size (the median is reported)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per entry")
    ap.add_argument("--dir", default=None, help="where to put the tier (default: a temporary directory)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-", dir=args.dir) as tmp:
        for size in sizes:
            rows.append(_run(Path(tmp), size, args.repeat, args.tokens))
    emit(
        "disk-tier",
        rows,
        params={"repeat": args.repeat, "tokens": args.tokens, "dir": args.dir or tempfile.gettempdir()},
    )
