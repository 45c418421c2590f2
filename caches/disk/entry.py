"""One disk-tier entry as rows: its records encoded for a put (whole, or as blocks), the blocks it writes.

`encode_entry` turns a put's tokens and payload (and its `Cut`, when it is stored as blocks) into the
state record's buffers, the index record, the manifest and the `Item` the mirror keeps; `write_blocks`
writes, inside the caller's write transaction, the block records not held yet. Why a row cannot be used
is said the same way for every row (`rejection`).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from caches.disk.cut import Cut, manifest
from caches.disk.format import (
    KIND_BLOCK,
    KIND_BLOCKED,
    KIND_INDEX,
    KIND_STATE,
    Buffer,
    PartsReader,
    StateFormatError,
    encode,
    encode_parts,
    record_size,
)
from caches.disk.mirror import Item
from caches.disk.store import BLK, TierStore
from runtime.errors import MissingValueFile, UnsafeRecord

__all__ = ["Encoded", "collect_blocks", "encode_entry", "rejection", "why", "write_blocks"]


def why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def rejection(e: BaseException) -> tuple[str, str]:
    """(reason, detail) for a row that cannot be used."""
    if isinstance(e, StateFormatError):
        return e.reason, str(e)
    if isinstance(e, MissingValueFile):
        return "missing", str(e)
    return ("unsafe" if isinstance(e, UnsafeRecord) else "unreadable"), why(e)


@dataclass(frozen=True, slots=True)
class Encoded:
    """An entry ready to write: the state record's buffers, the index record, the manifest (None: whole)."""

    parts: list[Buffer]
    index: bytes
    manifest: bytes | None
    item: Item
    cut: Cut | None

    @property
    def held(self) -> int:
        """The bytes it holds with all its blocks (what it takes alone under the byte limit)."""
        return self.item.nbytes + len(self.item.keys) * self.item.block_record


def encode_entry(
    fp: bytes, settings: str | bytes, toks: tuple[int, ...], tb: bytes, pieces: list[Buffer], c: Cut | None
) -> Encoded:
    kind, body = (KIND_STATE, pieces) if c is None else (KIND_BLOCKED, c.body())
    parts = encode_parts(kind, fp, settings, toks, body, token_bytes=tb)
    index = encode(KIND_INDEX, fp, settings, toks, payload_len=sum(len(p) for p in body), token_bytes=tb)
    nbytes = sum(len(p) for p in parts) + len(index)
    if c is None:
        return Encoded(parts, index, None, Item(toks, nbytes), None)
    block_record = record_size(KIND_BLOCK, fp, settings, c.block_cells, c.block_payload)
    logical = record_size(KIND_STATE, fp, settings, len(toks), c.whole_len) + len(index)
    man = manifest(c.keys, block_record, logical)
    return Encoded(parts, index, man, Item(toks, nbytes + len(man), tuple(c.keys), block_record, logical), c)


def write_blocks(store: TierStore, fp: bytes, settings: str | bytes, e: Encoded, held: Container[bytes]) -> int:
    """In the caller's write transaction: write the entry's block records not in `held`; how many."""
    c = e.cut
    if c is None:
        return 0
    b, new = c.block_cells, set()
    for i, k in enumerate(c.keys):
        if k in held or k in new:
            continue
        rec = encode_parts(KIND_BLOCK, fp, settings, e.item.tokens[i * b : (i + 1) * b], c.block_parts(i))
        store.put(BLK + k.hex(), PartsReader(rec), read=True)
        new.add(k)
    return len(new)


def collect_blocks(store: TierStore, held: Container[bytes]) -> tuple[set[bytes], int]:
    """In the caller's write transaction: remove the block rows whose key is not `held` (orphans: no entry
    lists them); (the held keys that have a row, how many rows were removed)."""
    present: set[bytes] = set()
    orphans = 0
    for key, _ in store.scan(BLK, values=False):
        try:
            k = bytes.fromhex(key[len(BLK) :])
        except ValueError:
            k = b""
        if k in held:
            present.add(k)
        else:
            store.delete(key)
            orphans += 1
    return present, orphans
