"""`python -m benchmarks swap`: state save and restore throughput (GB/s) for a long SmolLM2 state, vs memcpy.

SmolLM2-135M (`n_ctx` 8192) evaluates `--tokens` (6,000) tokens once; its sequence state is then ~140 MB.
Each operation runs `--repeat` times; the table gives the median (and best) time and GB/s (1e9 bytes/s):

- `memcpy (fresh buffer)`: `numpy.copy` of an array of the state's size (allocation + one copy: what a
  save has to do at least); `memcpy (into existing)`: `numpy.copyto` into a buffer allocated once;
- `save`: `Engine.state_get()` (llama.cpp writes into a fresh uninitialised buffer the cache keeps);
  `restore`: `Engine.state_set(view)` (llama.cpp reads the kept buffer in place);
- `save + restore`: both, bytes counted once per direction (the issue's target: >= 2 GB/s, or within
  1.5x of memcpy);
- `disk write`: `DiskTier.put(tokens, SlotState.parts())` (header + CRC-32 + file write, no joined copy);
  `disk read`: `DiskTier.find(tokens)` (index lookup, one read into a fresh buffer, CRC-32) and
  `disk read + restore`: the same, then `SlotState.decode` (views) and `Engine.state_set`;
- `disk blocks: ...` rows: the same with `DiskTier(blocks=DiskBlocks(KV, --block-cells))` (64, the
  `shared_blocks` default): `write, all new` cuts and writes every block (states of other first tokens);
  `write, all held` a state sharing every full block with one stored (only its record is written);
  `read (assembled)` reads that state's record and its shared blocks, each into its place in one buffer
  (the issue's goal: >= 2 GB/s); `read + restore` then `Engine.state_set`;
- `..., alternating` rows: `memcpy (into mapped memory)`, `disk read`, `before: disk read`, `disk blocks read`
  and `before: disk blocks read` of one state, one after the other in each of `--repeat` rounds, so that
  all five see the same load (`x_memcpy` against that memcpy). `before:` is the previous read path,
  re-enacted (`_before_read`): one thread, chunk after chunk, one row lookup per block;
- `before: ...` rows: the previous path, re-enacted here for comparison (a zeroed ctypes buffer then
  `bytes(...)`; `from_buffer_copy` on restore; msgpack encode/decode around the disk tier).

`--state-file F` writes the prefilled state to F, or loads it from F if it is there (the prefill is the
slow part on a busy machine; the file is only an input, the timed operations never touch it).
Disk rows write into `--dir` (default: a temporary directory) and read back from the page cache (the
files were just written; no fsync, as diskcache does none).

    python -m benchmarks swap [--tokens 6000] [--repeat 5] [--threads 2] [--dir DIR] [--model PATH] [--state-file F]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import msgspec
import numpy as np

from benchmarks import _cli, _timing
from caches.blocks import DEFAULT_BLOCK_CELLS
from caches.buffers import STATE_BUFFERS
from caches.disk.cut import read_body
from caches.disk.format import KIND_BLOCK, KIND_BLOCKED, KIND_STATE, decode, tokens_to_bytes
from caches.disk.store import BLK, REC
from caches.disk.tier import DiskBlocks, DiskTier
from caches.kvstate import Memory
from runtime.config import KV_TYPES, EngineConfig
from runtime.errors import StateFormatError
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path
from runtime.slot.state import SlotState

COLUMNS = ["operation", "MB", "median_ms", "best_ms", "GB_s", "best_GB_s", "x_memcpy"]


class _Legacy(msgspec.Struct):
    state: bytes
    checkpoints: tuple[Any, ...] = ()


def _old_get(eng: Engine) -> bytes:
    """The previous `state_get`: a zeroed ctypes buffer, then `bytes(...)`."""
    size = eng.state_size()
    buf = (ctypes.c_uint8 * size)()
    llama_cpp.llama_state_seq_get_data_ext(eng.ctx, buf, size, 0, 0)
    return bytes(buf)


def _old_set(eng: Engine, data: bytes) -> None:
    """The previous `state_set`: `from_buffer_copy`, then load."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    llama_cpp.llama_state_seq_set_data_ext(eng.ctx, buf, len(data), 0, 0)


def _row(name: str, nbytes: int, times: list[float], memcpy_s: float | None) -> dict[str, Any]:
    return {"operation": name, **_timing.throughput(nbytes, times, memcpy_s)}


def _fill(eng: Engine, n_tokens: int, *, evaluate: bool = True) -> list[int]:
    """Evaluate `n_tokens` tokens of text (a long document, repeated) into the sequence; the tokens."""
    text = " ".join(
        f"Paragraph {i}: the lighthouse keeper counted {i * 7} ships and wrote them down." for i in range(2000)
    )
    tokens = eng.tokenize(text)[:n_tokens]
    if not evaluate:
        return tokens
    eng.clear()
    for start in range(0, len(tokens), eng.n_batch):
        eng.decode(tokens[start : start + eng.n_batch], start, logits_last=False)
    return tokens


def run(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    model = Path(args.model) if args.model else default_model_path()
    cfg = EngineConfig(
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
        type_k=args.cache_type,
        type_v=args.cache_type,
    )
    rows: list[dict[str, Any]] = []
    with Engine(model, cfg) as eng:
        saved = Path(args.state_file) if args.state_file else None
        if saved is not None and saved.is_file() and eng.state_set(saved.read_bytes()):
            _cli.progress(f"state loaded from {saved}")
            tokens = _fill(eng, args.tokens, evaluate=False)
        else:
            _cli.progress(f"prefilling {args.tokens} tokens")
            tokens = _fill(eng, args.tokens)
            if saved is not None:
                saved.write_bytes(eng.state_get())
        if eng.pos_max() + 1 != args.tokens:
            raise RuntimeError(f"the sequence holds {eng.pos_max() + 1} tokens, not {args.tokens}")
        size = eng.state_size()
        r = args.repeat
        src = np.frombuffer(bytes(eng.state_get()), dtype=np.uint8)
        dst = np.empty_like(src)
        copies: list[Any] = []
        fresh = _timing.times_s(lambda: copies.append(src.copy()), r)  # kept, as a cache keeps its states
        copies.clear()
        into = _timing.times_s(lambda: np.copyto(dst, src), r)
        m_fresh, m_into = statistics.median(fresh), statistics.median(into)
        rows.append(_row("memcpy (fresh memory)", size, fresh, None))
        rows.append(_row("memcpy (into mapped memory)", size, into, None))
        kept: list[memoryview] = []
        cold = _timing.times_s(lambda: kept.append(eng.state_get()), r)  # every state kept: no buffer to reuse
        del kept[:-1]  # a cache at its limit: each save frees a state (the pool hands its memory on)

        def save_one() -> None:
            kept.append(eng.state_get())
            kept.pop(0)

        saves = _timing.times_s(save_one, r)
        state = kept[-1]
        restores = _timing.times_s(lambda: eng.state_set(state), r)
        rows.append(_row("save, fresh memory", size, cold, m_fresh))
        rows.append(_row("save (state_get)", size, saves, m_into))
        rows.append(_row("restore (state_set)", size, restores, m_into))
        both = [a + b for a, b in zip(saves, restores, strict=True)]
        rows.append(_row("save + restore", 2 * size, both, 2 * m_into))
        kept.clear()
        old_kept: list[bytes] = []
        old_saves = _timing.times_s(lambda: old_kept.append(_old_get(eng)), r)
        old_state = old_kept[-1]
        old_restores = _timing.times_s(lambda: _old_set(eng, old_state), r)
        rows.append(_row("before: save", size, old_saves, m_fresh))
        rows.append(_row("before: restore", size, old_restores, m_into))
        old_both = [a + b for a, b in zip(old_saves, old_restores, strict=True)]
        rows.append(_row("before: save + restore", 2 * size, old_both, m_fresh + m_into))
        old_kept.clear()

        slot_state = SlotState(state)
        with DiskTier(directory / "new", fingerprint="bench", settings=eng.settings_key, limit_bytes=0) as tier:
            keys = [[*tokens, i] for i in range(r)]
            it = iter(keys)
            writes = _timing.times_s(lambda: tier.put(next(it), slot_state.parts()), r)
            it = iter(keys)
            reads = _timing.times_s(lambda: tier.find(next(it)), r)
            it = iter(keys)

            def read_restore() -> None:
                found = tier.find(next(it))
                assert found is not None
                eng.state_set(SlotState.decode(found[1]).state)

            read_restores = _timing.times_s(read_restore, r)
            nbytes = tier.stats().bytes // r
        rows.append(_row("disk write", nbytes, writes, m_fresh))
        rows.append(_row("disk read", nbytes, reads, m_fresh))
        rows.append(_row("disk read + restore", nbytes, read_restores, m_fresh + m_into))

        rows += _block_rows(eng, tokens, slot_state, directory, args.block_cells, r, m_fresh, m_into)
        rows += _read_rows(eng, tokens, slot_state, directory, args.block_cells, r)

        enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(_Legacy)
        with DiskTier(directory / "old", fingerprint="bench", settings=eng.settings_key, limit_bytes=0) as tier:
            it = iter(keys)
            old_writes = _timing.times_s(lambda: tier.put(next(it), enc.encode(_Legacy(old_state))), r)
            it = iter(keys)

            def old_read_restore() -> None:
                found = tier.find(next(it))
                assert found is not None
                _old_set(eng, dec.decode(bytes(found[1])).state)

            old_read_restores = _timing.times_s(old_read_restore, r)
        rows.append(_row("before: disk write (msgpack)", nbytes, old_writes, m_fresh))
        rows.append(_row("before: disk read + restore", nbytes, old_read_restores, m_fresh + m_into))
        for row in rows:
            row["state_bytes"] = size
    return rows


def _block_rows(
    eng: Engine,
    tokens: list[int],
    slot_state: SlotState,
    directory: Path,
    block_cells: int,
    r: int,
    m_fresh: float,
    m_into: float,
) -> list[dict[str, Any]]:
    """The disk tier with shared blocks: writes (all new, all held), the assembled read, read + restore."""
    size = len(slot_state.state)
    blocks = DiskBlocks(Memory.KV, block_cells)
    with DiskTier(
        directory / "blocks", fingerprint="bench", settings=eng.settings_key, limit_bytes=0, blocks=blocks
    ) as tier:
        fresh = [[50_000 + i, *tokens[1:]] for i in range(r)]  # another first token: every block new
        held = [[50_000, *tokens[1:-1], 60_000 + i] for i in range(r)]  # all full blocks of fresh[0]
        it = iter(fresh)
        new_writes = _timing.times_s(lambda: tier.put(next(it), slot_state.parts()), r)
        it = iter(held)
        held_writes = _timing.times_s(lambda: tier.put(next(it), slot_state.parts()), r)
        it = iter(held)
        whole = sum(len(p) for p in slot_state.parts())

        def read() -> None:
            found = tier.find(next(it))
            assert found is not None and len(found[1]) == whole

        reads = _timing.times_s(read, r)
        it = iter(held)

        def read_restore() -> None:
            found = tier.find(next(it))
            assert found is not None
            eng.state_set(SlotState.decode(found[1]).state)

        read_restores = _timing.times_s(read_restore, r)
        st = tier.stats()
        if st.whole_states or st.blocks_shared != r * ((len(tokens) - 1) // block_cells):
            raise RuntimeError(f"the states were not shared as planned: {st}")
    return [
        _row(f"disk blocks ({block_cells}): write, all new", size, new_writes, m_fresh),
        _row(f"disk blocks ({block_cells}): write, all held", size, held_writes, m_fresh),
        _row(f"disk blocks ({block_cells}): read (assembled)", size, reads, m_fresh),
        _row(f"disk blocks ({block_cells}): read + restore", size, read_restores, m_fresh + m_into),
    ]


def _before_payload(f: Any, n: int, crc: int) -> tuple[memoryview, int]:
    """The previous whole-record read: 8 MiB chunks read one after the other, each checksummed after it."""
    view = STATE_BUFFERS.take(n)
    off = 0
    while off < n:
        got = f.readinto(view[off : min(n, off + (8 << 20))]) or 0
        if got <= 0:
            raise StateFormatError("truncated", "payload")
        crc = zlib.crc32(view[off : off + got], crc)
        off += got
    return view.toreadonly(), crc


def _before_read(tier: DiskTier, tokens: list[int]) -> memoryview:
    """The previous `find` read path, one thread (the index lookup is the same and left out): the state
    record, then each block's row looked up and its record read in order, checksummed as it is read."""
    d = tier._digest(tokens_to_bytes(tokens))
    item = tier._m.items[d]
    fp, settings, store = tier._fp, tier.settings, tier._store
    f = store.get(REC + d, read=True)
    with f:
        size = os.fstat(f.fileno()).st_size
        if not item.keys:
            toks = item.tokens
            return decode(
                f, size, kind=KIND_STATE, fingerprint=fp, settings=settings, tokens=toks, body=_before_payload
            ).payload
        got: list[Any] = []

        def body(rf: Any, n: int, crc: int) -> tuple[memoryview, int]:
            b, crc = read_body(rf, n, crc, item.keys)
            got.append(b)
            return b.dst, crc

        decode(f, size, kind=KIND_BLOCKED, fingerprint=fp, settings=settings, tokens=item.tokens, body=body)
    b = got[0]
    bc, geo = b.block_cells, b.geometry
    want = bc * geo.cell_bytes
    stage = memoryview(bytearray(want))
    for i, k in enumerate(item.keys):
        bf = store.get(BLK + k.hex(), read=True)

        def cells(rf: Any, n: int, crc: int, i: int = i) -> tuple[memoryview, int]:
            return memoryview(b""), geo.read_cells(rf, b.dst, i * bc, (i + 1) * bc, crc, stage)

        with bf:
            bsize = os.fstat(bf.fileno()).st_size
            toks = item.tokens[i * bc : (i + 1) * bc]
            decode(bf, bsize, kind=KIND_BLOCK, fingerprint=fp, settings=settings, tokens=toks, body=cells)
    view: memoryview = b.dst
    return view.toreadonly()


def _read_rows(
    eng: Engine, tokens: list[int], slot_state: SlotState, directory: Path, block_cells: int, r: int
) -> list[dict[str, Any]]:
    """The reads, now and before (`_before_read`), and a plain memcpy, measured alternating in one loop
    (on a shared machine the load changes from one second to the next)."""
    parts = slot_state.parts()
    whole = sum(len(p) for p in parts)
    src = np.frombuffer(bytes(slot_state.state), dtype=np.uint8)
    dst = np.empty_like(src)
    dst[:] = src
    settings = eng.settings_key
    tw = DiskTier(directory / "cmp-whole", fingerprint="bench", settings=settings, limit_bytes=0)
    blocks = DiskBlocks(Memory.KV, block_cells)
    tb = DiskTier(directory / "cmp-blocks", fingerprint="bench", settings=settings, limit_bytes=0, blocks=blocks)
    with tw, tb:
        tw.put(tokens, parts)
        tb.put(tokens, parts)
        names = ["memcpy (into mapped memory)", "disk read", "before: disk read"]
        names += ["disk blocks read", "before: disk blocks read"]

        def found(t: DiskTier) -> None:
            got = t.find(tokens)
            assert got is not None and len(got[1]) == whole

        ops: list[Callable[[], object]] = [
            lambda: np.copyto(dst, src),
            lambda: found(tw),
            lambda: _before_read(tw, tokens),
            lambda: found(tb),
            lambda: _before_read(tb, tokens),
        ]
        for op in ops:  # once each, untimed: every buffer mapped
            op()
        times: list[list[float]] = [[] for _ in ops]
        for _ in range(r):
            for op, out in zip(ops, times, strict=True):
                out += _timing.times_s(op, 1)
        if bytes(tb.find(tokens)[1]) != bytes(_before_read(tb, tokens)):  # type: ignore[index]
            raise RuntimeError("the two block reads disagree")
    m = statistics.median(times[0])
    label = f" ({block_cells}), alternating"
    return [_row(name.replace("blocks read", "blocks read" + label) if "blocks" in name else f"{name}, alternating",
                 len(src) if i == 0 else whole, t, None if i == 0 else m)
            for i, (name, t) in enumerate(zip(names, times, strict=True))]  # fmt: skip


def main(argv: list[str]) -> None:
    ap = _cli.parser("swap", __doc__)
    ap.add_argument("--tokens", type=int, default=6000, help="tokens in the state")
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each operation (median and best reported)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--dir", default=None, help="where the disk tier goes (default: a temporary directory)")
    ap.add_argument("--state-file", default=None, help="keep the prefilled state here and reuse it (skips prefill)")
    ap.add_argument("--block-cells", type=int, default=DEFAULT_BLOCK_CELLS, help="cells per block (disk blocks rows)")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write swap.json")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="GPU layers (the state moves device <-> host)")
    ap.add_argument("--cache-type", default="f16", choices=KV_TYPES, help="K and V cache type (-ctk/-ctv)")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.tokens >= args.n_ctx or args.repeat < 1:
        ap.error("--tokens must be in 1..n_ctx-1 and --repeat at least 1")
    with tempfile.TemporaryDirectory(prefix="turnstile-swap-", dir=args.dir) as tmp:
        rows = run(args, Path(tmp))
    _cli.write(
        "swap",
        rows,
        params={
            "model": (Path(args.model) if args.model else default_model_path()).name,
            "tokens": args.tokens,
            "n_ctx": args.n_ctx,
            "repeat": args.repeat,
            "threads": args.threads,
            "n_gpu_layers": args.n_gpu_layers,
            "cache_type": args.cache_type,
            "state_bytes": rows[0]["state_bytes"],
            "command": "python -m benchmarks swap " + " ".join(argv),
        },
        out=args.out,
        columns=COLUMNS,
    )
