"""The disk tier's in-memory usage book: each entry's last use and size, the byte total, the LRU order.

The directory holds the truth (a `"<last use, ns>:<bytes>"` row per entry, `parse_usage`); the book is
its copy, so that the byte total is one number and the least recently used entries come off a heap
(ordered by (last use, digest), as the reference sorts them) instead of a read of every row.
"""

from __future__ import annotations

import heapq

__all__ = ["UsageBook", "format_usage", "parse_usage"]


def parse_usage(raw: object, fallback_nbytes: int) -> tuple[int, int]:
    """(last use in ns, bytes) from a usage row; (0, `fallback_nbytes`) if it is absent or malformed."""
    if isinstance(raw, str) and raw.count(":") == 1:
        a, b = raw.split(":")
        if a.isdigit() and b.isdigit():
            return int(a), int(b)
    return 0, fallback_nbytes


def format_usage(stamp: int, nbytes: int) -> str:
    return f"{stamp}:{nbytes}"


class UsageBook:
    """digest -> (last use, bytes), with the total and a lazy min-heap for the LRU order."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[int, int]] = {}
        self._heap: list[tuple[int, str]] = []
        self.total = 0

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, digest: object) -> bool:
        return digest in self._rows

    def get(self, digest: str) -> tuple[int, int] | None:
        return self._rows.get(digest)

    def set(self, digest: str, stamp: int, nbytes: int) -> None:
        old = self._rows.get(digest)
        if old is not None:
            self.total -= old[1]
        self._rows[digest] = (stamp, nbytes)
        self.total += nbytes
        if old is None or old[0] != stamp:
            heapq.heappush(self._heap, (stamp, digest))
            if len(self._heap) > 2 * len(self._rows) + 64:
                self._heap = [(s, d) for d, (s, _) in self._rows.items()]
                heapq.heapify(self._heap)

    def discard(self, digest: str) -> None:
        old = self._rows.pop(digest, None)
        if old is not None:
            self.total -= old[1]

    def oldest(self, keep: str | None) -> str | None:
        """The least recently used digest other than `keep` (None if there is none); not removed."""
        heap, held, found = self._heap, None, None
        while heap:
            stamp, d = heap[0]
            row = self._rows.get(d)
            if row is None or row[0] != stamp:
                heapq.heappop(heap)  # stale
            elif d == keep:
                held = heapq.heappop(heap)  # look past it, then put it back
            else:
                found = d
                break
        if held is not None:
            heapq.heappush(heap, held)
        return found

    def victims(self, limit: int, keep: str | None) -> list[str]:
        """The least recently used digests (never `keep`) to remove so that the total fits `limit`.

        Does not remove them: the caller does (`discard`), in its transaction.
        """
        total, out, held = self.total, [], []
        seen: set[str] = set()
        heap = self._heap
        while total > limit and heap:
            stamp, d = heapq.heappop(heap)
            row = self._rows.get(d)
            if row is None or row[0] != stamp or d in seen:
                continue
            seen.add(d)
            if d == keep:
                held.append((stamp, d))
                continue
            out.append(d)
            total -= row[1]
        for item in held:
            heapq.heappush(heap, item)
        return out
