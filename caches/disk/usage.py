"""The disk tier's in-memory usage book: each entry's last use, size and owner, the byte totals, the LRU order.

The directory holds the truth (a usage row per entry, `parse_usage`); the book is its copy, so that the byte
total is one number and the least recently used entries come off a heap (ordered by (last use, digest), as
the reference sorts them) instead of a read of every row. One heap per owner (`caches.shares`: the key
namespace whose state the entry is), so that the tier can take the least recently used entry of the owner
furthest over its share.

Usage rows (a `str`, never pickled): version 2 is `"<last use, ns>:<bytes>:<owner>"` (the owner a key name,
`[A-Za-z0-9._-]`, at most 64 characters, "" for none); version 1, written before owners existed, is
`"<last use, ns>:<bytes>"` and reads as owner "" (no key: the entry keeps its place, and its bytes count as
one more owner's). Anything else reads as never used, the entry's own size, owner "".
"""

from __future__ import annotations

import heapq
import re

__all__ = ["UsageBook", "format_usage", "parse_usage"]

_OWNER = re.compile(r"[A-Za-z0-9._-]{0,64}")  # `caches.shares.is_owner`


def parse_usage(raw: object, fallback_nbytes: int) -> tuple[int, int, str]:
    """(last use in ns, bytes, owner) from a usage row; (0, `fallback_nbytes`, "") if it is absent or malformed."""
    if isinstance(raw, str):
        fields = raw.split(":")
        if len(fields) in (2, 3) and fields[0].isdigit() and fields[1].isdigit():
            owner = fields[2] if len(fields) == 3 else ""
            if _OWNER.fullmatch(owner):
                return int(fields[0]), int(fields[1]), owner
    return 0, fallback_nbytes, ""


def format_usage(stamp: int, nbytes: int, owner: str = "") -> str:
    """A version 2 usage row; `owner` a key name (`[A-Za-z0-9._-]`, at most 64 characters) or ""."""
    if not _OWNER.fullmatch(owner):
        raise ValueError(f"not a key name: {owner!r}")
    return f"{stamp}:{nbytes}:{owner}"


class UsageBook:
    """digest -> (last use, bytes, owner), with the totals (all, per owner) and a lazy min-heap per owner."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[int, int, str]] = {}
        self._heaps: dict[str, list[tuple[int, str]]] = {}
        self._counts: dict[str, int] = {}
        self.by_owner: dict[str, int] = {}
        """Bytes of each owner's entries' own records (owners with an entry only)."""
        self.total = 0

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, digest: object) -> bool:
        return digest in self._rows

    def get(self, digest: str) -> tuple[int, int] | None:
        row = self._rows.get(digest)
        return row[:2] if row is not None else None

    def owner(self, digest: str) -> str | None:
        row = self._rows.get(digest)
        return row[2] if row is not None else None

    @property
    def owners(self) -> list[str]:
        """The owners with an entry, in a fixed order."""
        return sorted(self._counts)

    def set(self, digest: str, stamp: int, nbytes: int, owner: str = "") -> None:
        old = self._rows.get(digest)
        if old is not None:
            self._unbook(old)
        self._rows[digest] = (stamp, nbytes, owner)
        self.total += nbytes
        self.by_owner[owner] = self.by_owner.get(owner, 0) + nbytes
        self._counts[owner] = self._counts.get(owner, 0) + 1
        if old is None or old[0] != stamp or old[2] != owner:
            heap = self._heaps.setdefault(owner, [])
            heapq.heappush(heap, (stamp, digest))
            if len(heap) > 2 * self._counts[owner] + 64:
                heap[:] = [(s, d) for d, (s, _, o) in self._rows.items() if o == owner]
                heapq.heapify(heap)

    def discard(self, digest: str) -> None:
        old = self._rows.pop(digest, None)
        if old is not None:
            self._unbook(old)

    def _unbook(self, row: tuple[int, int, str]) -> None:
        _, nbytes, owner = row
        self.total -= nbytes
        self.by_owner[owner] -= nbytes
        self._counts[owner] -= 1
        if not self._counts[owner]:
            del self._counts[owner], self.by_owner[owner]
            self._heaps.pop(owner, None)

    def oldest(self, keep: str | None, owner: str | None = None) -> str | None:
        """The least recently used digest other than `keep` (of `owner`; None: of any), or None; not removed."""
        if owner is not None:
            found = self._oldest_of(owner, keep)
            return found[1] if found is not None else None
        best = min((f for o in list(self._heaps) if (f := self._oldest_of(o, keep)) is not None), default=None)
        return best[1] if best is not None else None

    def _oldest_of(self, owner: str, keep: str | None) -> tuple[int, str] | None:
        heap, held, found = self._heaps.get(owner, []), None, None
        while heap:
            stamp, d = heap[0]
            row = self._rows.get(d)
            if row is None or row[0] != stamp or row[2] != owner:
                heapq.heappop(heap)  # stale
            elif d == keep:
                held = heapq.heappop(heap)  # look past it, then put it back
            else:
                found = heap[0]
                break
        if held is not None:
            heapq.heappush(heap, held)
        return found
