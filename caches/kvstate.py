"""llama.cpp's sequence-state format, parsed by cell range: cut a state into blocks of cells, put it back.

The one module that knows the byte layout `llama_state_seq_get_data` writes (llama.cpp as vendored by
llama-cpp-python 0.3.36). Pure Python and numpy on bytes: no llama.cpp here.

    state   = magic u32 (0xaf143cd8) · seq_id i32 · memory
    memory  = kv                      a transformer's KV cache (llama_kv_cache)
            | kv(base) · kv(swa)      sliding-window models (llama_kv_cache_iswa; PARTIAL_ONLY: swa only)
            | kv(attn) · recurrent    hybrid models (llama_memory_hybrid; PARTIAL_ONLY: recurrent only)
            | recurrent               recurrent models (llama_memory_recurrent)
    kv      = n_stream u32 (1) · cell_count u32 · cell_count × meta · v_trans u32 · n_layer u32
              · n_layer × (k_type i32 · k_row u64 · cell_count × k_row)
              · n_layer × (v_type i32 · v_row u64 · cell_count × v_row)                 v_trans = 0
                        | (v_type i32 · v_el u32 · n_embd_v u32 · n_embd_v × cell_count × v_el)   v_trans = 1
    meta    = pos i32 · n_seq_id u32 (1) · [ext: x i32 · y i32 · tok i32] · seq_id i32
    recurrent = cell_count u32 · cell_count × (pos i32 · n_seq_id u32 (0)) · s_trans u32 (0) · n_layer u32
              · records (type i32 · row u64 · cell_count × row) to the end

Only the first KV section (the one that holds every position of the history) is cut, by cell index; a
cell range [a, b) of it is its meta entries, its K rows of every layer and its V rows (or, V transposed,
its columns of each of the n_embd_v rows). A block's *payload* is those bytes gathered segment by segment.
Everything else (the small per-layer headers, the SWA section of sliding-window models, the recurrent
section of hybrid and recurrent models) is the state's *frame*, kept whole.

Invariants:
- `parse` accepts a state only if every field is where this layout puts it and the sections end exactly at
  the end of the buffer; anything else (another llama.cpp version, another memory kind, garbage) raises
  `StateLayoutError`, never a wrong cut. The ext field, whose presence the bytes do not say, is decided
  by the parse: both readings (without, with) are tried, and if both fit they must agree.
- A section is cut only if its cells hold positions 0, 1, …, n-1 in that order, each in the state's own
  sequence alone; otherwise the state parses with nothing to cut (`StateLayout.reason` says why).
- `assemble(frame(s), [payload(s, a, b) for each range]) == s`, byte for byte, for any partition of the
  cells into consecutive ranges; payloads of states with the same `signature` are interchangeable.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from caches.buffers import STATE_BUFFERS
from runtime.errors import StateLayoutError

__all__ = [
    "MAGIC",
    "Frame",
    "Memory",
    "Segment",
    "StateLayout",
    "assemble",
    "frame",
    "memory_of",
    "parse",
    "payload",
]

MAGIC = 0xAF143CD8
"""The first u32 of every sequence state (llama-context.cpp `io_magic`)."""

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_MAX_LAYERS = 4096

# ggml type id -> (elements per block, bytes per block), for the types a KV cache or a recurrent state uses
_GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # f32
    1: (1, 2),  # f16
    2: (32, 18),  # q4_0
    3: (32, 20),  # q4_1
    6: (32, 22),  # q5_0
    7: (32, 24),  # q5_1
    8: (32, 34),  # q8_0
    20: (32, 18),  # iq4_nl
    30: (1, 2),  # bf16
}

Buffer = bytes | bytearray | memoryview


class Memory(enum.StrEnum):
    """Which llama.cpp memory wrote the state: decides the sections `parse` expects."""

    KV = "kv"
    ISWA = "iswa"
    HYBRID = "hybrid"
    RECURRENT = "recurrent"


def memory_of(kind: str, n_swa: int) -> Memory:
    """The memory of a model from the engine's `MemoryKind` value and its `n_swa` (SWA models keep an
    iswa cache also with `swa_full`, when the engine calls them transformers)."""
    if kind == "recurrent":
        return Memory.RECURRENT
    if kind == "hybrid":
        return Memory.HYBRID
    if kind == "sliding_window" or n_swa > 0:
        return Memory.ISWA
    if kind == "transformer":
        return Memory.KV
    raise StateLayoutError("layout", f"unknown memory kind {kind!r}")


@dataclass(frozen=True, slots=True)
class Segment:
    """Per-cell data of the cut section: `rows` rows of `cell_bytes` per cell, row r of cell i at
    `offset + (r * n_cells + i) * cell_bytes` (rows > 1 only for transposed V)."""

    offset: int
    cell_bytes: int
    rows: int = 1


@dataclass(frozen=True, slots=True)
class StateLayout:
    """Where one state's cuttable cells are. `segments` is empty when nothing can be cut (`reason`)."""

    size: int
    n_cells: int
    segments: tuple[Segment, ...]
    reason: str = ""

    @property
    def cell_bytes(self) -> int:
        """Payload bytes per cell (meta + K + V of every layer)."""
        return sum(s.cell_bytes * s.rows for s in self.segments)

    @property
    def shape(self) -> tuple[tuple[int, int], ...]:
        return tuple((s.cell_bytes, s.rows) for s in self.segments)

    def gaps(self) -> list[tuple[int, int]]:
        """The byte ranges outside the segments: one before each segment and the rest after the last."""
        out: list[tuple[int, int]] = []
        at = 0
        for s in self.segments:
            out.append((at, s.offset))
            at = s.offset + s.cell_bytes * s.rows * self.n_cells
        out.append((at, self.size))
        return out


@dataclass(frozen=True, slots=True)
class Frame:
    """A state without its cut cells: the bytes between the segments (the last one: every section that is
    kept whole), the cell count and the segments' shape. `assemble` puts payloads back into it."""

    gaps: tuple[bytes, ...]
    n_cells: int
    shape: tuple[tuple[int, int], ...]
    signature: bytes

    @property
    def cell_bytes(self) -> int:
        return sum(cb * rows for cb, rows in self.shape)

    @property
    def size(self) -> int:
        """Bytes of the whole state."""
        return sum(len(g) for g in self.gaps) + self.n_cells * self.cell_bytes

    @property
    def nbytes(self) -> int:
        """Bytes the frame itself holds."""
        return sum(len(g) for g in self.gaps)


class _Reader:
    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int, what: str) -> int:
        at = self.pos
        if n < 0 or at + n > len(self.buf):
            raise StateLayoutError("layout", f"{what} at byte {at} runs past the end ({len(self.buf)} bytes)")
        self.pos = at + n
        return at

    def u32(self, what: str) -> int:
        return int(_U32.unpack_from(self.buf, self._take(4, what))[0])

    def i32(self, what: str) -> int:
        return int(_I32.unpack_from(self.buf, self._take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(_U64.unpack_from(self.buf, self._take(8, what))[0])

    def skip(self, n: int, what: str) -> int:
        return self._take(n, what)


def _bad(what: str) -> StateLayoutError:
    return StateLayoutError("layout", what)


def _row_type(r: _Reader, what: str) -> tuple[int, int]:
    t = r.i32(f"{what} type")
    if t not in _GGML_TYPES:
        raise _bad(f"{what}: unknown ggml type {t}")
    return t, _GGML_TYPES[t][1]


def _rows(r: _Reader, n: int, what: str) -> Segment:
    _, type_size = _row_type(r, what)
    row = r.u64(f"{what} row size")
    if row == 0 or row % type_size:
        raise _bad(f"{what}: row size {row} is not a whole number of its type's blocks")
    return Segment(r.skip(n * row, f"{what} rows"), row)


@dataclass(frozen=True, slots=True)
class _Kv:
    n_cells: int
    segments: tuple[Segment, ...]
    reason: str


def _parse_kv(r: _Reader, seq_id: int, meta_size: int, name: str) -> _Kv:
    n_stream = r.u32(f"{name} n_stream")
    if n_stream != 1:
        raise _bad(f"{name}: {n_stream} streams (one is known)")
    n = r.u32(f"{name} cell count")
    if n == 0:
        return _Kv(0, (), "empty")
    meta_at = r.skip(n * meta_size, f"{name} cell meta")
    v_trans = r.u32(f"{name} v_trans")
    n_layer = r.u32(f"{name} n_layer")
    if v_trans not in (0, 1) or not 0 < n_layer <= _MAX_LAYERS:
        raise _bad(f"{name}: v_trans {v_trans}, n_layer {n_layer}")
    segments = [Segment(meta_at, meta_size)]
    segments += [_rows(r, n, f"{name} layer {il} K") for il in range(n_layer)]
    for il in range(n_layer):
        if not v_trans:
            segments.append(_rows(r, n, f"{name} layer {il} V"))
            continue
        t, type_size = _row_type(r, f"{name} layer {il} V")
        el = r.u32(f"{name} layer {il} V element size")
        n_embd = r.u32(f"{name} layer {il} V width")
        if _GGML_TYPES[t][0] != 1 or el != type_size or n_embd == 0:
            raise _bad(f"{name} layer {il} V: type {t}, element size {el}, width {n_embd}")
        segments.append(Segment(r.skip(n * el * n_embd, f"{name} layer {il} V rows"), el, n_embd))
    meta = np.frombuffer(r.buf, dtype=np.int32, count=n * meta_size // 4, offset=meta_at).reshape(n, -1)
    if np.any(meta[:, 1] != 1) or np.any(meta[:, -1] != seq_id):
        raise _bad(f"{name}: a cell is not in sequence {seq_id} alone")
    if not np.array_equal(meta[:, 0], np.arange(n, dtype=np.int32)):
        return _Kv(n, tuple(segments), "positions are not 0..n-1 in cell order")
    return _Kv(n, tuple(segments), "")


def _parse_recurrent(r: _Reader) -> None:
    n = r.u32("recurrent cell count")
    for i in range(n):
        r.i32(f"recurrent cell {i} pos")
        if r.u32(f"recurrent cell {i} n_seq_id") != 0:
            raise _bad(f"recurrent cell {i}: sequence ids in a sequence state")
    s_trans = r.u32("recurrent s_trans")
    n_layer = r.u32("recurrent n_layer")
    if s_trans != 0 or not 0 < n_layer <= _MAX_LAYERS:
        raise _bad(f"recurrent: s_trans {s_trans}, n_layer {n_layer}")
    rows: list[int] = []  # the R tensor of each recurrent layer, then its S tensor: one row size each
    while r.pos < len(r.buf):
        rows.append(_rows(r, n, f"recurrent record {len(rows)}").cell_bytes)
    k = len(rows) // 2
    if not rows or len(rows) % 2 or len(rows) > 2 * n_layer or len({*rows[:k]}) != 1 or len({*rows[k:]}) != 1:
        raise _bad(f"recurrent: tensors of {rows} bytes a row for {n_layer} layers")


def _parse(buf: memoryview, memory: Memory, partial: bool, meta_size: int) -> StateLayout:
    r = _Reader(buf)
    if r.u32("magic") != MAGIC:
        raise _bad("not a llama.cpp sequence state (magic)")
    seq_id = r.i32("seq_id")
    cut = _Kv(0, (), "no attention cache")
    if memory is Memory.KV or (memory in (Memory.ISWA, Memory.HYBRID) and not partial):
        cut = _parse_kv(r, seq_id, meta_size, "kv")
    if memory is Memory.ISWA:
        _parse_kv(r, seq_id, meta_size, "swa")
    elif memory in (Memory.HYBRID, Memory.RECURRENT):
        _parse_recurrent(r)
    if r.pos != len(buf):
        raise _bad(f"{len(buf) - r.pos} bytes after the last section")
    if cut.reason:
        return StateLayout(len(buf), 0, (), cut.reason)
    return StateLayout(len(buf), cut.n_cells, cut.segments)


def parse(state: Buffer, memory: Memory, *, partial: bool = False) -> StateLayout:
    """The layout of a state written by `llama_state_seq_get_data(_ext)` (PARTIAL_ONLY when `partial`).

    Raises StateLayoutError when it is not a state of that memory in the layout this module knows.
    """
    buf = memoryview(state).cast("B")
    found: list[StateLayout] = []
    errors: list[str] = []
    has_kv = memory in (Memory.KV, Memory.ISWA) or (memory is Memory.HYBRID and not partial)
    for meta_size in (12, 24) if has_kv else (12,):  # without / with the cell ext (M-RoPE positions, PLE token)
        try:
            found.append(_parse(buf, memory, partial, meta_size))
        except StateLayoutError as e:
            errors.append(str(e))
    if not found:
        raise _bad(errors[0])
    if len(found) == 2 and found[0] != found[1]:  # equal: no cell meta was read (empty sections)
        raise _bad("both cell meta readings fit")
    return found[0]


def _signature(buf: memoryview, layout: StateLayout, gaps: list[tuple[int, int]]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(layout.shape).encode())
    if layout.segments:
        g0 = bytearray(buf[gaps[0][0] : gaps[0][1]])
        g0[-4:] = b"\0\0\0\0"  # the cell count, which the block size does not depend on
        h.update(g0)
        for a, b in gaps[1:-1]:
            h.update(buf[a:b])
    return h.digest()


def frame(state: Buffer, layout: StateLayout) -> Frame:
    """The state's bytes outside its cut cells (a copy), with the `signature` of its cell layout: the
    header fields every payload's meaning depends on (sequence id, K/V types and row sizes, v_trans)."""
    buf = memoryview(state).cast("B")
    gaps = layout.gaps()
    return Frame(tuple(bytes(buf[a:b]) for a, b in gaps), layout.n_cells, layout.shape, _signature(buf, layout, gaps))


def payload(state: Buffer, layout: StateLayout, start: int, stop: int, out: bytearray | None = None) -> bytearray:
    """A copy of cells [start, stop) of the cut section, segment by segment (into `out`, reused, if given)."""
    n = layout.n_cells
    if not 0 <= start <= stop <= n:
        raise StateLayoutError("range", f"cells [{start}, {stop}) of {n}")
    m = stop - start
    if out is None:
        out = bytearray(m * layout.cell_bytes)
    elif len(out) != m * layout.cell_bytes:
        raise StateLayoutError("range", f"a buffer of {len(out)} bytes for {m} cells of {layout.cell_bytes}")
    dst = memoryview(out)
    src = memoryview(state).cast("B")
    at = 0
    for s in layout.segments:
        w = m * s.cell_bytes
        if s.rows == 1:
            a = s.offset + start * s.cell_bytes
            dst[at : at + w] = src[a : a + w]
        else:
            whole = np.frombuffer(src, np.uint8, s.rows * n * s.cell_bytes, s.offset).reshape(s.rows, -1)
            part = np.frombuffer(out, np.uint8, s.rows * w, at).reshape(s.rows, w)
            part[:] = whole[:, start * s.cell_bytes : start * s.cell_bytes + w]
        at += s.rows * w
    return out


def assemble(fr: Frame, payloads: Sequence[Buffer], out: memoryview | None = None) -> memoryview:
    """The state of `fr` with its cells from `payloads` (consecutive ranges from cell 0, covering all of
    them), written in one pass into `out` (or a buffer from `STATE_BUFFERS`): each byte once.

    Raises StateLayoutError if the payloads do not cover the frame's cells exactly.
    """
    n, per_cell, size = fr.n_cells, fr.cell_bytes, fr.size
    dst = STATE_BUFFERS.take(size) if out is None else out
    if len(dst) != size:
        raise StateLayoutError("range", f"output of {len(dst)} bytes for a state of {size}")
    at = 0
    seg_at: list[int] = []
    for gap, (cb, rows) in zip(fr.gaps, fr.shape, strict=False):
        dst[at : at + len(gap)] = gap
        at += len(gap)
        seg_at.append(at)
        at += n * cb * rows
    last = fr.gaps[-1]
    dst[at : at + len(last)] = last
    wide = {
        i: np.frombuffer(dst, np.uint8, rows * n * cb, seg_at[i]).reshape(rows, n * cb)
        for i, (cb, rows) in enumerate(fr.shape)
        if rows > 1
    }
    cell = 0
    for p in payloads:
        src = memoryview(p).cast("B")
        m, rest = divmod(len(src), per_cell) if per_cell else (0, len(src))
        if rest or cell + m > n:
            raise StateLayoutError("range", f"a payload of {len(src)} bytes at cell {cell} of {n}")
        pat = 0
        for i, (cb, rows) in enumerate(fr.shape):
            w = m * cb
            d = seg_at[i] + cell * cb
            if rows == 1:
                dst[d : d + w] = src[pat : pat + w]
            else:
                wide[i][:, cell * cb : cell * cb + w] = np.frombuffer(src, np.uint8, rows * w, pat).reshape(rows, w)
            pat += rows * w
        cell += m
    if cell != n:
        raise StateLayoutError("range", f"payloads cover {cell} of {n} cells")
    del wide
    return dst
