"""Reading one entry's state back from the disk tier's directory: a whole record, or a body and its blocks.

No lock here and no changes: a read that cannot be used raises `_Unusable` (what failed and why, and
which block when it was one), and `DiskTier` decides, in line with the directory, whether that is damage
(the entry, or every entry using the block, removed and logged) or only a row another writer removed
meanwhile (a miss).
"""

from __future__ import annotations

import io
import os
from typing import Any

from caches.disk.cut import read_body
from caches.disk.entry import rejection
from caches.disk.format import KIND_BLOCK, KIND_BLOCKED, KIND_STATE, RecordFile, StateFormatError, decode
from caches.disk.mirror import Item
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
    try:
        with f:
            if not item.keys:
                rec = decode(f, size, kind=KIND_STATE, fingerprint=fp, settings=settings, tokens=item.tokens)
                return rec.payload, size
            got: list[Any] = []

            def body(rf: RecordFile, n: int, crc: int) -> tuple[memoryview, int]:
                b, crc = read_body(rf, n, crc, item.keys)
                got.append(b)
                return b.dst, crc

            decode(f, size, kind=KIND_BLOCKED, fingerprint=fp, settings=settings, tokens=item.tokens, body=body)
    except (StateFormatError, OSError) as e:
        raise _unusable(e) from e
    b = got[0]
    total = size
    bc, geo = b.block_cells, b.geometry
    want = bc * geo.cell_bytes
    stage = memoryview(bytearray(want))  # a transposed segment's rows, one block at a time
    for i, k in enumerate(item.keys):
        bf, bsize = _open(store, BLK + k.hex(), k)

        def cells(rf: RecordFile, n: int, crc: int, i: int = i, want: int = want) -> tuple[memoryview, int]:
            if n != want:
                raise StateFormatError("length", f"a block of {n} bytes, {want} expected")
            return memoryview(b""), geo.read_cells(rf, b.dst, i * bc, (i + 1) * bc, crc, stage)

        try:
            with bf:
                toks = item.tokens[i * bc : (i + 1) * bc]
                decode(bf, bsize, kind=KIND_BLOCK, fingerprint=fp, settings=settings, tokens=toks, body=cells)
        except (StateFormatError, OSError) as e:
            raise _unusable(e, k) from e
        total += bsize
    return b.dst.toreadonly(), total
