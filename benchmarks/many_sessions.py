"""`python -m benchmarks many-sessions`: the disk tier with many stored conversations.

Each row fills a fresh `DiskTier` with N conversations that share a system prompt (`--system` tokens)
and differ after it (a user part of 50-400 tokens), each with a tiny payload (`--payload` bytes), then
times `--samples` finds (a stored conversation coming back with a new message: the prompt is its
tokens plus 30 new ones) and `--samples` puts (new conversations), and the open of a second tier on
the filled directory (which loads the index). `fill_s` is the time to fill N: linear if a put costs
the same whatever N. `scan_ms` is the reference rule (`scan_rank`, a scan over every entry, what
`find` cost before the index) on the same prompts, for comparison.

Shared blocks (`many-sessions-blocks.json`, rows for `--blocks-sizes`, default 10,000; `""` to skip): a tier
with `DiskBlocks(KV, --block-cells)` holds N conversations sharing a `--prefix` (1,500) token prefix, each
with 20-100 tokens of its own, every state in SmolLM2-135M's real layout and size (30 layers, f16 K and V
rows of 384 bytes: 23,052 bytes a cell; synthetic bytes, `--layers` / `--row` to change). Columns:
`disk_MB` what the directory holds (its files and cache.db), `stored_MB` the tier's figure (records, each
block once), `logical_MB` what whole copies would take, `x_unique` stored / the KV of the unique tokens
(the prefix once and each conversation's own tokens); `lookup_p50_ms` the index's answer for a returning
conversation (`DiskTier.find`'s choice, without reading the state), `find_p50_ms` the whole `find` (the
state read back from its blocks and record), `put_p50_ms` a new conversation's `put` (its own blocks
and record written, the prefix's found held); `*_cpu_p50_ms` the CPU time the process spent on one (all
its threads: the readers' pool too), steadier than the wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import structlog

from benchmarks._report import emit
from caches.blocks import DEFAULT_BLOCK_CELLS
from caches.disk.index import scan_rank
from caches.disk.tier import DiskBlocks, DiskTier
from caches.kvstate import MAGIC, Memory


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


_SIZES = (24, 40, 56, 72, 88)  # own tokens per conversation: one state buffer per size, reused


def _kv_state(n: int, layers: int, row: int) -> bytes:
    """A llama.cpp KV sequence state of n cells at positions 0..n-1 (`caches.kvstate`'s layout), f16 rows."""
    rng = np.random.default_rng(n)
    meta = np.zeros((n, 3), dtype=np.int32)
    meta[:, 0], meta[:, 1] = np.arange(n), 1
    rows = rng.integers(0, 255, n * row, dtype=np.uint8).tobytes()
    k = b"".join(struct.pack("<iQ", 1, row) + rows for _ in range(layers))
    return struct.pack("<IiII", MAGIC, 0, 1, n) + meta.tobytes() + struct.pack("<II", 0, layers) + k + k


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _run_blocks(directory: Path, n: int, samples: int, args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(args.seed)
    prefix = [rng.randrange(32_000) for _ in range(args.prefix)]
    states = {k: _kv_state(args.prefix + k, args.layers, args.row) for k in _SIZES}
    head = b"slot-header"

    def conversation() -> list[int]:
        return prefix + [rng.randrange(32_000) for _ in range(rng.choice(_SIZES))]

    stored = [conversation() for _ in range(n)]
    blocks = DiskBlocks(Memory.KV, args.block_cells)
    cell = 12 + 2 * args.layers * args.row
    with DiskTier(directory, fingerprint="bench", settings="n_ctx=8192", limit_bytes=0, blocks=blocks) as tier:
        t0 = time.perf_counter()
        for i, tokens in enumerate(stored):
            if not tier.put(tokens, [head, states[len(tokens) - args.prefix]]):
                raise RuntimeError("put refused")
            if i % 1000 == 999:
                _progress(f"{i + 1} of {n} stored, {tier.nbytes / 1e9:.2f} GB")
        fill = time.perf_counter() - t0
        back = [rng.choice(stored) for _ in range(samples)]
        prompts = [[*tokens, *(rng.randrange(32_000) for _ in range(30))] for tokens in back]
        lookups, finds, puts, find_cpu, put_cpu = [], [], [], [], []
        for tokens, prompt in zip(back, prompts, strict=True):
            t0 = time.perf_counter()
            with tier._lock:
                tier._sync()
                hit = tier._m.trie.best(tuple(prompt), 0)
            lookups.append(time.perf_counter() - t0)
            t0, c0 = time.perf_counter(), time.process_time()
            got = tier.find(prompt)
            finds.append(time.perf_counter() - t0)
            find_cpu.append(time.process_time() - c0)
            if (
                hit is None
                or got is None
                or got[0] != tokens
                or len(got[1]) != len(head) + len(states[len(tokens) - args.prefix])
            ):
                raise RuntimeError("find chose another entry")
            del got
        for _ in range(samples):
            tokens = conversation()
            t0, c0 = time.perf_counter(), time.process_time()
            tier.put(tokens, [head, states[len(tokens) - args.prefix]])
            puts.append(time.perf_counter() - t0)
            put_cpu.append(time.process_time() - c0)
        st = tier.stats()
        held = [item.tokens for item in tier._m.items.values()]
    unique = (args.prefix + sum(len(t) - args.prefix for t in held)) * cell
    return {
        "stored": n,
        "block_cells": args.block_cells,
        "cell_bytes": cell,
        "disk_MB": _du(directory) / 1e6,
        "stored_MB": st.stored_bytes / 1e6,
        "logical_MB": st.logical_bytes / 1e6,
        "x_unique": st.stored_bytes / unique if unique else 0.0,
        "x_whole": st.stored_bytes / st.logical_bytes,
        "blocks": st.blocks,
        "lookup_p50_ms": _pct(lookups, 0.5),
        "find_p50_ms": _pct(finds, 0.5),
        "find_p99_ms": _pct(finds, 0.99),
        "put_p50_ms": _pct(puts, 0.5),
        "put_p99_ms": _pct(puts, 0.99),
        "find_cpu_p50_ms": _pct(find_cpu, 0.5),
        "put_cpu_p50_ms": _pct(put_cpu, 0.5),
        "fill_s": fill,
    }


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


BLOCK_COLUMNS = [
    "stored",
    "block_cells",
    "disk_MB",
    "stored_MB",
    "logical_MB",
    "x_unique",
    "x_whole",
    "lookup_p50_ms",
    "find_p50_ms",
    "put_p50_ms",
    "put_p99_ms",
    "find_cpu_p50_ms",
    "put_cpu_p50_ms",
    "fill_s",
]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks many-sessions", description=__doc__)
    ap.add_argument("--sizes", default="100,1000,10000", help="stored conversations per row, comma-separated")
    ap.add_argument("--samples", type=int, default=200, help="timed finds and puts per row")
    ap.add_argument("--system", type=int, default=600, help="tokens of the shared system prompt")
    ap.add_argument("--payload", type=int, default=4096, help="payload bytes per entry")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks-sizes", default="10000", help="shared-blocks rows: stored conversations, comma-separated")
    ap.add_argument("--prefix", type=int, default=1500, help="shared-blocks rows: tokens of the shared prefix")
    ap.add_argument("--block-cells", type=int, default=DEFAULT_BLOCK_CELLS)
    ap.add_argument("--layers", type=int, default=30, help="shared-blocks rows: layers of the state (SmolLM2: 30)")
    ap.add_argument("--row", type=int, default=384, help="shared-blocks rows: K and V row bytes (SmolLM2: 384)")
    ap.add_argument("--dir", default=None, help="where to put the tiers (default: a temporary directory)")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write many-sessions.json")
    args = ap.parse_args(argv)
    if not structlog.is_configured():  # the tier logs every put and hit at debug level
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    block_sizes = [int(s) for s in args.blocks_sizes.split(",") if s.strip()]
    rows, block_rows = [], []
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-", dir=args.dir) as tmp:
        for n in sizes:
            rows.append(_run(Path(tmp) / f"n{n}", n, args.samples, args.system, args.payload, args.seed))
        for n in block_sizes:
            block_rows.append(_run_blocks(Path(tmp) / f"blocks{n}", n, args.samples, args))
            shutil.rmtree(Path(tmp) / f"blocks{n}")
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
    if block_rows:
        emit(
            "many-sessions-blocks",
            block_rows,
            params={
                "samples": args.samples,
                "prefix_tokens": args.prefix,
                "own_tokens": list(_SIZES),
                "layers": args.layers,
                "row_bytes": args.row,
                "dir": args.dir or tempfile.gettempdir(),
            },
            out=Path(args.out) / "many-sessions-blocks.json" if args.out else None,
            columns=BLOCK_COLUMNS,
        )
