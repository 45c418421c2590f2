"""The disk tier's picture of its directory in memory: the entries, their token trie and their usage.

The directory holds the truth; `DiskTier` keeps this mirror in line with it (at open, and whenever the
change counter moved) and changes both together inside its write transactions. Lookups (`best`,
`prefixes`), the byte total and the eviction order then cost nothing per stored entry.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from caches.disk.format import KIND_INDEX, KIND_STATE, StateFormatError, decode, record_size
from caches.disk.index import TokenIndex
from caches.disk.usage import UsageBook, parse_usage

__all__ = ["Item", "Mirror"]


@dataclass(frozen=True, slots=True)
class Item:
    tokens: tuple[int, ...]
    nbytes: int
    """State + index record bytes from the index record (used if the usage row is missing)."""


class Mirror:
    """digest -> `Item`, with a `TokenIndex` over the tokens and a `UsageBook` over the usage rows."""

    def __init__(self, fingerprint: bytes, settings: str | bytes) -> None:
        self._fp = fingerprint
        self._settings = settings
        self.items: dict[str, Item] = {}
        self.trie = TokenIndex()
        self.usage = UsageBook()

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, digest: object) -> bool:
        return digest in self.items

    @property
    def total(self) -> int:
        """Bytes of the entries (their usage rows' figures)."""
        return self.usage.total

    def clear(self) -> dict[str, Item]:
        """Forget everything; return the items held (decoded index records can be reused)."""
        items = self.items
        self.items, self.trie, self.usage = {}, TokenIndex(), UsageBook()
        return items

    def item(self, raw: object) -> Item:
        """An index row as an item; raises `StateFormatError` (or the row's own exception) if unusable."""
        if isinstance(raw, BaseException):
            raise raw
        if not isinstance(raw, bytes):
            raise StateFormatError("kind", f"a {type(raw).__name__} value")
        rec = decode(io.BytesIO(raw), len(raw), kind=KIND_INDEX, fingerprint=self._fp, settings=self._settings)
        state_len = record_size(KIND_STATE, self._fp, self._settings, len(rec.tokens), rec.payload_len)
        return Item(rec.tokens, state_len + len(raw))

    def add(self, d: str, item: Item, usage_row: object) -> None:
        """Add (or refresh) an entry, with its usage row (`parse_usage`'s fallback if it is malformed)."""
        self.items[d] = item
        self.trie.add(d, item.tokens)
        self.usage.set(d, *parse_usage(usage_row, item.nbytes))

    def set_usage(self, d: str, usage_row: object) -> None:
        item = self.items.get(d)
        if item is not None:
            self.usage.set(d, *parse_usage(usage_row, item.nbytes))

    def drop(self, d: str) -> None:
        item = self.items.pop(d, None)
        if item is not None:
            self.trie.remove(d, item.tokens)
        self.usage.discard(d)
