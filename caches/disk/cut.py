"""The disk tier's states as shared blocks: how a put's payload is cut, and how a state is read back.

With `DiskBlocks` configured, one buffer of a put's payload (`part`: the sequence state, as
`llama_state_seq_get_data` wrote it) is parsed by `caches.kvstate`; its full blocks of `block_cells` cells
become block records (kind 4, one per chained key of `caches.blocks.chain_keys`, stored once however many
entries use them), and everything else goes in the entry's own record (kind 3, the *body*):

    body  = head "<4sHHIIIIQQQ": magic b"TSBB", version 1, 0, block_cells, n_cells, n_keys, n_seg,
                                 pre_len, post_len, whole_len
            · n_seg × (cell_bytes u32, rows u32)      the cut section's segments (`kvstate.Segment`)
            · (n_seg + 1) × gap length u64            the state's bytes outside its cells (`StateLayout.gaps`)
            · n_keys × key (16 bytes)                 the entry's full blocks, in order
            · pre · gaps · tail cells · post          the payload's other buffers, the frame, the partial block

`whole_len` is the whole payload's length (`pre` + the state + `post`). A block record's payload is its
cells as `kvstate.payload` gathers them (segment by segment). The entry's manifest row (`manifest`) repeats
the keys, with a block record's size and the whole record's, so the index knows every entry's blocks
without reading a state record.

Reading: `read_body` reads the body straight into one buffer of `whole_len` (from `STATE_BUFFERS`), every
byte where the whole payload has it; meanwhile the blocks are read into their cells' places
(`Geometry.place`: one vectored read, `preadv`, straight into the places of its segments; a transposed
segment's rows through a block-sized buffer, then `scatter`), several at once (`caches.disk.reads`). Each
byte is copied once, from the page cache into the state, as a whole record is read; each record's CRC-32
is computed on the bytes just read.

Invariants: the state read back is byte for byte the payload that was put, provided every block under a
key holds the bytes of the first state stored with it (keys chain the tokens and everything before, so two
states with a block's key agree on its cells' tokens and positions; `caches.blocks`); a body whose tables
do not add up raises `StateFormatError` before anything large is allocated.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from caches import kvstate
from caches.blocks import DEFAULT_BLOCK_CELLS, chain_keys, chain_seed
from caches.buffers import STATE_BUFFERS
from caches.disk.format import Buffer, RecordFile
from caches.disk.pread import pread_into
from caches.kvstate import Memory
from runtime.errors import InvalidConfig, StateFormatError, StateLayoutError

__all__ = ["Cut", "DiskBlocks", "Geometry", "cut", "manifest", "parse_manifest", "read_body"]

_BODY = struct.Struct("<4sHHIIIIQQQ")
_SEG = struct.Struct("<II")
_MAN = struct.Struct("<4sHHIQQ")
_BODY_MAGIC, _MAN_MAGIC, _VERSION = b"TSBB", b"TSBM", 1
KEY_BYTES = 16
_MAX_SEGMENTS = 2 * 4096 + 1
_MAX_WHOLE = 1 << 40


@dataclass(frozen=True, slots=True)
class DiskBlocks:
    """The disk tier stores states as shared blocks: of `block_cells` cells, cutting buffer `part` of each
    put's payload (a sequence state of `memory`); a payload with fewer buffers, or a state that cannot be
    cut, is stored whole."""

    memory: Memory
    block_cells: int = DEFAULT_BLOCK_CELLS
    part: int = 1

    def __post_init__(self) -> None:
        b = self.block_cells
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise InvalidConfig(f"block_cells must be a positive int, not {b!r}")
        if not isinstance(self.part, int) or self.part < 0:
            raise InvalidConfig(f"part must be an int >= 0, not {self.part!r}")


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where the cut cells lie in a buffer (the state itself for a `Cut`, the whole payload for a `Body`):
    segment i's row r of cell c at
    `seg_at[i] + (r * n_cells + c) * cell_bytes`."""

    n_cells: int
    shape: tuple[tuple[int, int], ...]
    seg_at: tuple[int, ...]

    @property
    def cell_bytes(self) -> int:
        return sum(cb * rows for cb, rows in self.shape)

    def views(self, src: memoryview, a: int, b: int) -> list[Buffer]:
        """Cells [a, b) of `src` in payload order (views; a transposed segment's rows gathered, a copy)."""
        out: list[Buffer] = []
        m = b - a
        for (cb, rows), at in zip(self.shape, self.seg_at, strict=True):
            if rows == 1:
                out.append(src[at + a * cb : at + b * cb])
            else:
                wide = np.frombuffer(src, np.uint8, rows * self.n_cells * cb, at).reshape(rows, -1)
                out.append(np.ascontiguousarray(wide[:, a * cb : a * cb + m * cb]).reshape(-1).data)
        return out

    def has_wide(self) -> bool:
        """Whether a segment is transposed (its cells' bytes are not contiguous in the state)."""
        return any(rows > 1 for _, rows in self.shape)

    def place(self, dst: memoryview, a: int, b: int, stage: memoryview) -> tuple[list[memoryview], list[Wide]]:
        """Where cells [a, b) go when read in payload order: the views to fill one after the other (into
        `dst` itself, a transposed segment's rows into `stage`), and those staged (for `scatter`)."""
        m = b - a
        views: list[memoryview] = []
        wide: list[Wide] = []
        st_at = 0
        for (cb, rows), at in zip(self.shape, self.seg_at, strict=True):
            w = m * cb
            if rows == 1:
                views.append(dst[at + a * cb : at + b * cb])
            else:
                v = stage[st_at : st_at + rows * w]
                views.append(v)
                wide.append((v, cb, rows, at))
                st_at += rows * w
        return views, wide

    def scatter(self, dst: memoryview, a: int, b: int, wide: list[Wide]) -> None:
        """Put the staged rows of transposed segments (`place`) in their places in `dst`."""
        m = b - a
        for v, cb, rows, at in wide:
            w = m * cb
            full = np.frombuffer(dst, np.uint8, rows * self.n_cells * cb, at).reshape(rows, -1)
            full[:, a * cb : a * cb + w] = np.frombuffer(v, np.uint8).reshape(rows, w)
            del full

    def read_cells(self, f: RecordFile, dst: memoryview, a: int, b: int, crc: int, stage: memoryview) -> int:
        """Read cells [a, b) (payload order, as `views` gives them) from `f` into their places in `dst`, in
        one vectored read straight into them (a transposed segment's rows through `stage`, then put in
        place); the crc continued over them."""
        views, wide = self.place(dst, a, b, stage)
        crc = read_views(f, views, crc)
        self.scatter(dst, a, b, wide)
        return crc


Wide = tuple[memoryview, int, int, int]
"""A transposed segment's rows staged for `Geometry.scatter`: (staged view, cell bytes, rows, offset)."""


def read_views(f: RecordFile, views: list[memoryview], crc: int) -> int:
    """Fill `views` one after the other from `f` (one `preadv` for a file; StateFormatError if it ends
    first); the crc continued over them."""
    try:
        fd = f.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError):  # not a file (io.BytesIO: a row kept in the database)
        for v in views:
            crc = read_into(f, v, crc)
        return crc
    start = f.tell()  # type: ignore[attr-defined]
    pread_into(fd, start, views)
    f.seek(start + sum(len(v) for v in views))  # type: ignore[attr-defined]
    for v in views:
        crc = zlib.crc32(v, crc)
    return crc


def read_into(f: RecordFile, view: memoryview, crc: int) -> int:
    """Fill `view` from `f` (StateFormatError if it ends first); the crc continued over it."""
    off, n = 0, len(view)
    while off < n:
        got = f.readinto(view[off:]) or 0
        if got <= 0:
            raise StateFormatError("truncated", f"wanted {n} bytes, got {off}")
        off += got
    return zlib.crc32(view, crc)


@dataclass(frozen=True, slots=True)
class Cut:
    """One put's payload cut: its block keys, each block's payload buffers, the body's buffers."""

    keys: list[bytes]
    geometry: Geometry
    src: memoryview  # the sequence state (a view of the caller's buffer; `geometry` addresses it)
    pieces: list[Buffer]
    part: int
    frame_gaps: list[memoryview]
    block_cells: int
    whole_len: int

    @property
    def block_payload(self) -> int:
        return self.block_cells * self.geometry.cell_bytes

    def block_parts(self, i: int) -> list[Buffer]:
        b = self.block_cells
        return self.geometry.views(self.src, i * b, (i + 1) * b)

    def body(self) -> list[Buffer]:
        g = self.geometry
        pre, post = self.pieces[: self.part], self.pieces[self.part + 1 :]
        head = _BODY.pack(
            _BODY_MAGIC,
            _VERSION,
            0,
            self.block_cells,
            g.n_cells,
            len(self.keys),
            len(g.shape),
            sum(len(p) for p in pre),
            sum(len(p) for p in post),
            self.whole_len,
        )
        tables = b"".join(_SEG.pack(cb, rows) for cb, rows in g.shape)
        tables += b"".join(struct.pack("<Q", len(gap)) for gap in self.frame_gaps)
        tail = g.views(self.src, len(self.keys) * self.block_cells, g.n_cells)
        return [head + tables + b"".join(self.keys), *pre, *self.frame_gaps, *tail, *post]


def cut(blocks: DiskBlocks, namespace: bytes, tokens: Sequence[int], pieces: list[Buffer]) -> Cut:
    """`pieces` cut for the disk; raises StateLayoutError (stored whole, the caller logs why) if it cannot be."""
    if len(pieces) <= blocks.part:
        raise StateLayoutError("layout", f"a payload of {len(pieces)} buffers has no part {blocks.part}")
    state = memoryview(pieces[blocks.part]).cast("B")
    layout = kvstate.parse(state, blocks.memory)
    if layout.reason:
        raise StateLayoutError("layout", layout.reason)
    if layout.n_cells != len(tokens):
        raise StateLayoutError("layout", f"a state of {layout.n_cells} cells stored with {len(tokens)} tokens")
    fr = kvstate.frame(state, layout)
    keys = chain_keys(chain_seed(blocks.block_cells, namespace, fr.signature), tokens, blocks.block_cells)
    geo = Geometry(layout.n_cells, layout.shape, tuple(s.offset for s in layout.segments))  # within the state
    gaps = [state[a:b] for a, b in layout.gaps()]
    return Cut(keys, geo, state, pieces, blocks.part, gaps, blocks.block_cells, sum(len(p) for p in pieces))


@dataclass(frozen=True, slots=True)
class Body:
    """A body read into its whole payload: the buffer, where its cells go, its keys."""

    dst: memoryview
    geometry: Geometry
    keys: tuple[bytes, ...]
    block_cells: int


def read_body(
    f: RecordFile, n: int, crc: int, keys: Sequence[bytes], begin: Callable[[Body], None] | None = None
) -> tuple[Body, int]:
    """Read a body of `n` bytes into a fresh whole-payload buffer (see the module); the crc continued.

    `begin(body)` is called once the buffer is taken and the geometry known, before the body's own bytes
    are read (the caller starts reading the blocks into their places meanwhile). Raises StateFormatError
    if its tables do not add up or its keys are not `keys` (the manifest's)."""
    fixed = bytearray(_BODY.size)
    if n < _BODY.size:
        raise StateFormatError("truncated", "blocked body head")
    crc = read_into(f, memoryview(fixed), crc)
    magic, version, _, bc, n_cells, n_keys, n_seg, pre, post, whole = _BODY.unpack(fixed)
    if magic != _BODY_MAGIC or version != _VERSION:
        raise StateFormatError("layout", f"blocked body {magic!r} version {version}")
    if not 0 < n_seg <= _MAX_SEGMENTS or bc < 1 or n_keys * bc > n_cells or n_keys != len(keys):
        raise StateFormatError("layout", f"blocked body: {n_seg} segments, {n_keys} keys of {bc} of {n_cells}")
    tab_len = n_seg * _SEG.size + (n_seg + 1) * 8 + n_keys * KEY_BYTES
    if _BODY.size + tab_len > n:
        raise StateFormatError("truncated", "blocked body tables")
    tables = bytearray(tab_len)
    crc = read_into(f, memoryview(tables), crc)
    shape = tuple(_SEG.unpack_from(tables, i * _SEG.size) for i in range(n_seg))
    at = n_seg * _SEG.size
    gaps = [int(struct.unpack_from("<Q", tables, at + 8 * i)[0]) for i in range(n_seg + 1)]
    at += (n_seg + 1) * 8
    got_keys = tuple(bytes(tables[at + KEY_BYTES * i : at + KEY_BYTES * (i + 1)]) for i in range(n_keys))
    if got_keys != tuple(keys):
        raise StateFormatError("layout", "the state record lists other blocks than its manifest")
    cell_bytes = sum(cb * rows for cb, rows in shape)
    state_len = sum(gaps) + n_cells * cell_bytes
    tail = (n_cells - n_keys * bc) * cell_bytes
    if whole != pre + state_len + post or whole > _MAX_WHOLE or any(rows == 0 for _, rows in shape):
        raise StateFormatError("length", f"blocked body: a payload of {whole} bytes does not add up")
    if _BODY.size + tab_len + pre + sum(gaps) + tail + post != n:
        raise StateFormatError("length", f"blocked body: {n} bytes, the tables say otherwise")
    seg_at, pos = [], pre
    for gap, (cb, rows) in zip(gaps, shape, strict=False):
        pos += gap
        seg_at.append(pos)
        pos += n_cells * cb * rows
    geo = Geometry(n_cells, shape, tuple(seg_at))
    dst = STATE_BUFFERS.take(whole)
    body = Body(dst, geo, got_keys, bc)
    if begin is not None:
        begin(body)
    crc = read_into(f, dst[:pre], crc)
    starts = [pre, *(s + n_cells * cb * rows for s, (cb, rows) in zip(seg_at, shape, strict=True))]
    for start, gap in zip(starts, gaps, strict=True):
        crc = read_into(f, dst[start : start + gap], crc)
    stage = memoryview(bytearray(tail if geo.has_wide() else 0))
    crc = geo.read_cells(f, dst, n_keys * bc, n_cells, crc, stage)
    crc = read_into(f, dst[whole - post :], crc)
    return body, crc


def manifest(keys: Sequence[bytes], block_record: int, logical: int) -> bytes:
    """An entry's manifest row: its block keys, one block record's bytes, the whole record's bytes; CRC-32."""
    raw = _MAN.pack(_MAN_MAGIC, _VERSION, 0, len(keys), block_record, logical) + b"".join(keys)
    return raw + struct.pack("<I", zlib.crc32(raw))


def parse_manifest(raw: object) -> tuple[tuple[bytes, ...], int, int, int]:
    """(keys, block record bytes, logical bytes, row bytes) from a manifest row; StateFormatError if it is
    not one."""
    if not isinstance(raw, bytes) or len(raw) < _MAN.size + 4:
        raise StateFormatError("manifest", f"a {type(raw).__name__} of {len(raw) if isinstance(raw, bytes) else 0}")
    if zlib.crc32(raw[:-4]) != struct.unpack("<I", raw[-4:])[0]:
        raise StateFormatError("checksum", "manifest")
    magic, version, _, n_keys, block_record, logical = _MAN.unpack_from(raw)
    if magic != _MAN_MAGIC or version != _VERSION or len(raw) != _MAN.size + KEY_BYTES * n_keys + 4:
        raise StateFormatError("manifest", f"{magic!r} version {version}, {n_keys} keys in {len(raw)} bytes")
    keys = tuple(raw[_MAN.size + KEY_BYTES * i : _MAN.size + KEY_BYTES * (i + 1)] for i in range(n_keys))
    return keys, block_record, logical, len(raw)
