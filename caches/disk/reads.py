"""Reading one entry's state back from the disk tier's directory: a whole record, or a body and its blocks.

No lock here and no changes: a read that cannot be used raises `_Unusable` (what failed and why, and
which block when it was one), and `DiskTier` decides, in line with the directory, whether that is damage
(the entry, or every entry using the block, removed and logged) or only a row another writer removed
meanwhile (a miss).
"""

from __future__ import annotations

import io
import os
import threading
import zlib
from functools import partial
from typing import Any

from caches.disk.cut import Body, read_body
from caches.disk.entry import rejection
from caches.disk.format import (
    KIND_BLOCK,
    KIND_BLOCKED,
    KIND_STATE,
    RecordFile,
    StateFormatError,
    decode,
    record_head,
    tokens_to_bytes,
)
from caches.disk.mirror import Item
from caches.disk.pread import Batch, pread_into
from caches.disk.store import BLK, REC, TierStore
from runtime.errors import MissingValueFile, UnsafeRecord

__all__ = ["_Unusable", "read_state"]


class _Unusable(Exception):
    """A row that cannot be used: `reason` and `detail` as `disk_tier.rejected` logs them; `block` the
    block's key when it was a block's row."""

    def __init__(self, reason: str, detail: str, block: bytes | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.block = reason, detail, block


def _unusable(e: BaseException, block: bytes | None = None) -> _Unusable:
    return _Unusable(*rejection(e), block)


def _open(store: TierStore, key: str, block: bytes | None) -> tuple[Any, int]:
    """(file, size) of a row stored as a file (or as bytes); _Unusable if it is absent or unreadable."""
    try:
        handle: Any = store.get(key, read=True)
    except (UnsafeRecord, MissingValueFile, OSError) as e:
        raise _unusable(e, block) from e
    if handle is None:
        raise _Unusable("missing", "no block record" if block else "no state record", block)
    if isinstance(handle, bytes):
        return io.BytesIO(handle), len(handle)
    try:
        return handle, os.fstat(handle.fileno()).st_size
    except OSError as e:
        handle.close()
        raise _unusable(e, block) from e


def read_state(store: TierStore, d: str, item: Item, fp: bytes, settings: str | bytes) -> tuple[memoryview, int]:
    """The entry's whole payload (a read-only view of one buffer) and the bytes read; raises _Unusable."""
    f, size = _open(store, REC + d, None)
    if not item.keys:
        try:
            with f:
                rec = decode(f, size, kind=KIND_STATE, fingerprint=fp, settings=settings, tokens=item.tokens)
        except (StateFormatError, OSError) as e:
            raise _unusable(e) from e
        return rec.payload, size
    where = store.locate([BLK + k.hex() for k in item.keys])
    blocks = _Blocks(item, fp, settings, where)

    def body(rf: RecordFile, n: int, crc: int) -> tuple[memoryview, int]:
        b, crc = read_body(rf, n, crc, item.keys, begin=blocks.start)
        return b.dst, crc

    try:
        try:
            with f:
                decode(f, size, kind=KIND_BLOCKED, fingerprint=fp, settings=settings, tokens=item.tokens, body=body)
        except (StateFormatError, OSError) as e:
            raise _unusable(e) from e
        dst = blocks.wait()
    finally:
        blocks.abandon()  # (after wait: nothing left) no block is still being read into the buffer
    return dst.toreadonly(), size + len(item.keys) * item.block_record


class _Blocks:
    """An entry's blocks read into their places in the state's buffer, several at once (`pread.Batch`).

    `start` (called by `read_body` once the buffer and the geometry are known) starts one read per block;
    `wait` gives the buffer once every block is in place, or raises `_Unusable` for the first block (in
    order) that cannot be used: its row absent, its file gone, its record damaged or not this block's."""

    def __init__(self, item: Item, fp: bytes, settings: str | bytes, where: dict[str, Any]) -> None:
        self.item, self.fp, self.settings, self.where = item, fp, settings, where
        self.body: Body | None = None
        self.batch: Batch[None] | None = None

    def start(self, body: Body) -> None:
        self.body = body
        self.batch = Batch([partial(self._read, i, k) for i, k in enumerate(self.item.keys)])

    def wait(self) -> memoryview:
        assert self.body is not None and self.batch is not None
        try:
            self.batch.wait()
        except _Unusable:
            raise
        except (StateFormatError, OSError, UnsafeRecord) as e:  # (_read says which block)
            raise _unusable(e) from e
        return self.body.dst

    def abandon(self) -> None:
        if self.batch is not None:
            self.batch.abandon()

    def _read(self, i: int, k: bytes) -> None:
        """On the pool: block i read into its cells' places and checked; _Unusable if it cannot be used."""
        try:
            self._read_block(i, k)
        except _Unusable:
            raise
        except (StateFormatError, OSError, UnsafeRecord, MissingValueFile) as e:
            raise _unusable(e, k) from None  # (no traceback: it would hold views of the buffer)

    def _read_block(self, i: int, k: bytes) -> None:
        b = self.body
        assert b is not None
        name = BLK + k.hex()
        if name not in self.where:
            raise _Unusable("missing", "no block record", k)
        src = self.where[name]
        if isinstance(src, BaseException):
            raise _unusable(src, k)
        bc, geo, item = b.block_cells, b.geometry, self.item
        toks = item.tokens[i * bc : (i + 1) * bc]
        want = bc * geo.cell_bytes
        head = record_head(KIND_BLOCK, self.fp, self.settings, tokens_to_bytes(toks), want)
        size = len(head) + want + 4
        stage = _stage(want if geo.has_wide() else 0)
        views, wide = geo.place(b.dst, i * bc, (i + 1) * bc, stage)
        got, tail = bytearray(len(head)), bytearray(4)
        if isinstance(src, str):
            try:
                fd = os.open(src, os.O_RDONLY)
            except OSError as e:
                raise MissingValueFile(src, f"{type(e).__name__}: {e.strerror or e}") from e
            try:
                whole = os.fstat(fd).st_size == size
                if whole:
                    pread_into(fd, 0, [memoryview(got), *views, memoryview(tail)])
            finally:
                os.close(fd)
        elif isinstance(src, bytes):
            whole = len(src) == size
            if whole:
                raw = memoryview(src)
                got[:], tail[:], at = raw[: len(head)], raw[-4:], len(head)
                for v in views:
                    v[:] = raw[at : at + len(v)]
                    at += len(v)
        else:
            raise StateFormatError("kind", f"a block row holding a {type(src).__name__}")
        crc = zlib.crc32(got)
        for v in views:
            crc = zlib.crc32(v, crc)
        if whole and got == head and crc == int.from_bytes(tail, "little"):
            geo.scatter(b.dst, i * bc, (i + 1) * bc, wide)
            return
        self._recheck(src, i, toks, want, stage)  # say what is wrong, as `decode` would

    def _recheck(self, src: str | bytes, i: int, toks: tuple[int, ...], want: int, stage: memoryview) -> None:
        """A block record that is not what it should be, read again through `decode` for its reason (it
        raises); one that passes now (rewritten meanwhile) was read into its place again, whole."""
        b = self.body
        assert b is not None
        bc, geo = b.block_cells, b.geometry

        def cells(rf: RecordFile, n: int, crc: int) -> tuple[memoryview, int]:
            if n != want:
                raise StateFormatError("length", f"a block of {n} bytes, {want} expected")
            return memoryview(b""), geo.read_cells(rf, b.dst, i * bc, (i + 1) * bc, crc, stage)

        f: Any = io.BytesIO(src) if isinstance(src, bytes) else open(src, "rb")  # noqa: SIM115
        with f:
            size = len(src) if isinstance(src, bytes) else os.fstat(f.fileno()).st_size
            decode(f, size, kind=KIND_BLOCK, fingerprint=self.fp, settings=self.settings, tokens=toks, body=cells)


_local = threading.local()


def _stage(n: int) -> memoryview:
    """A buffer of `n` bytes for this thread's transposed rows (kept per thread, grown as needed)."""
    buf: bytearray | None = getattr(_local, "stage", None)
    if buf is None or len(buf) < n:
        buf = _local.stage = bytearray(n)
    return memoryview(buf)[:n]
