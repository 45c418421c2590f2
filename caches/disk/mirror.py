"""The disk tier's picture of its directory in memory: the entries, their token trie and their usage.

The directory holds the truth; `DiskTier` keeps this mirror in line with it (at open, and whenever the
change counter moved) and changes both together inside its write transactions. Lookups (`best`,
`prefixes`), the byte total and the eviction order then cost nothing per stored entry.

Blocks (`caches.disk.cut`): an entry stored as blocks lists their keys (its manifest row); the mirror
counts, per key, the entries that list it. Those counts are derived from the entries, never stored, so
they cannot disagree with the directory: a block row is needed exactly while its count is above zero.
`add` and `drop` return the keys whose count fell to zero (the caller, in its write transaction, removes
those rows when it is the writer; a refresh from another writer's changes only forgets them).

Bytes: `total` = each entry's own records (usage rows) + each held block once (the byte limit's figure);
`logical` = what the entries would take stored whole; `charged(owner)` = an owner's entries' own records +
every block they list, a block shared with another owner's entry included (`caches.shares`: the share
eviction's figure).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from caches.disk.cut import parse_manifest
from caches.disk.format import KIND_INDEX, KIND_STATE, StateFormatError, decode, record_size
from caches.disk.index import TokenIndex
from caches.disk.usage import UsageBook, parse_usage

__all__ = ["Item", "Mirror"]


@dataclass(frozen=True, slots=True)
class Item:
    tokens: tuple[int, ...]
    nbytes: int
    """The entry's own record bytes (state + index + manifest), used if the usage row is missing."""
    keys: tuple[bytes, ...] = ()
    """Its blocks, in order (empty: stored whole)."""
    block_record: int = 0
    """Bytes of one of its block records."""
    logical: int = 0
    """What it would take stored whole (0: `nbytes`)."""

    @property
    def whole_bytes(self) -> int:
        return self.logical or self.nbytes


class Mirror:
    """digest -> `Item`, with a `TokenIndex` over the tokens and a `UsageBook` over the usage rows."""

    def __init__(self, fingerprint: bytes, settings: str | bytes) -> None:
        self._fp = fingerprint
        self._settings = settings
        self.items: dict[str, Item] = {}
        self.trie = TokenIndex()
        self.usage = UsageBook()
        self.blocks: dict[bytes, list[int]] = {}  # key -> [entries listing it, record bytes]
        self.block_total = 0
        self.logical = 0
        self._listed: dict[str, int] = {}  # owner -> bytes of the blocks its entries list (shared ones in full)

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, digest: object) -> bool:
        return digest in self.items

    @property
    def total(self) -> int:
        """Bytes held: the entries' own records (their usage rows' figures) and each block once."""
        return self.usage.total + self.block_total

    def clear(self) -> dict[str, Item]:
        """Forget everything; return the items held (decoded index records can be reused)."""
        items = self.items
        self.items, self.trie, self.usage = {}, TokenIndex(), UsageBook()
        self.blocks, self.block_total, self.logical, self._listed = {}, 0, 0, {}
        return items

    def charged(self, owner: str) -> int:
        """What `owner`'s entries hold: their own records and every block they list (shared ones in full)."""
        return self.usage.by_owner.get(owner, 0) + self._listed.get(owner, 0)

    def _list(self, d: str, item: Item, sign: int) -> None:
        owner = self.usage.owner(d)
        if owner is not None and item.keys:
            left = self._listed.get(owner, 0) + sign * len(item.keys) * item.block_record
            if left:
                self._listed[owner] = left
            else:
                self._listed.pop(owner, None)

    def item(self, raw: object, man: object = None) -> Item:
        """An index row (and its manifest row, None if it has none) as an item; raises `StateFormatError`
        (or the row's own exception) if unusable."""
        for value in (raw, man):
            if isinstance(value, BaseException):
                raise value
        if not isinstance(raw, bytes):
            raise StateFormatError("kind", f"a {type(raw).__name__} value")
        rec = decode(io.BytesIO(raw), len(raw), kind=KIND_INDEX, fingerprint=self._fp, settings=self._settings)
        state_len = record_size(KIND_STATE, self._fp, self._settings, len(rec.tokens), rec.payload_len)
        if man is None:
            return Item(rec.tokens, state_len + len(raw))
        keys, block_record, logical, man_len = parse_manifest(man)
        return Item(rec.tokens, state_len + len(raw) + man_len, keys, block_record, logical)

    def add(self, d: str, item: Item, usage_row: object) -> list[bytes]:
        """Add (or refresh) an entry, with its usage row (`parse_usage`'s fallback if it is malformed); the
        keys no entry lists any more (those only the entry it replaced listed)."""
        for k in item.keys:
            row = self.blocks.get(k)
            if row is None:
                self.blocks[k] = [1, item.block_record]
                self.block_total += item.block_record
            else:
                row[0] += 1
        old = self.items.get(d)
        freed = self._unref(old) if old is not None else []
        if old is not None:
            self.logical -= old.whole_bytes
            self._list(d, old, -1)
        self.items[d] = item
        self.logical += item.whole_bytes
        self.trie.add(d, item.tokens)
        self.usage.set(d, *parse_usage(usage_row, item.nbytes))
        self._list(d, item, 1)
        return freed

    def _unref(self, item: Item) -> list[bytes]:
        freed = []
        for k in item.keys:
            row = self.blocks.get(k)
            if row is None:
                continue
            row[0] -= 1
            if row[0] <= 0:
                del self.blocks[k]
                self.block_total -= row[1]
                freed.append(k)
        return freed

    def users(self, key: bytes) -> list[str]:
        """The entries that list block `key` (a scan: for the rare damaged block)."""
        return [d for d, item in self.items.items() if key in item.keys]

    def set_usage(self, d: str, usage_row: object) -> None:
        item = self.items.get(d)
        if item is not None:
            self._list(d, item, -1)
            self.usage.set(d, *parse_usage(usage_row, item.nbytes))
            self._list(d, item, 1)

    def drop(self, d: str) -> list[bytes]:
        """Forget an entry; the keys no entry lists any more."""
        item = self.items.pop(d, None)
        if item is not None:
            self._list(d, item, -1)
        self.usage.discard(d)
        if item is None:
            return []
        self.trie.remove(d, item.tokens)
        self.logical -= item.whole_bytes
        return self._unref(item)
