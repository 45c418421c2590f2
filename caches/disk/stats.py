"""The disk tier's numbers: `DiskTierStats` (a snapshot) and `TierCounters`, where the tier keeps them.

`DiskTier.stats()` is read on the event loop (`Runtime.stats()`, `GET /metrics`) while the slot's worker
may be in the middle of a `put`, which holds the tier's lock through a whole state write. So the counters
do not live behind that lock: they live here, behind a lock of their own that is held only for a few
additions or a copy, never for I/O. The tier adds to them as it works and publishes what its directory
holds (entries, bytes) after each of its write transactions; `snapshot()` takes only the small lock, so
it never waits for a write and never touches the disk.

What a snapshot says about the directory is as of this tier's last completed operation: a transaction
still running (or rolled back) is not in it, and writes by another tier or process on the same directory
show once this tier next looks at the directory (every operation catches up first).

Lock order: the tier's lock, then this one; nothing takes the tier's lock while holding this one.
"""

from __future__ import annotations

import threading

import msgspec

__all__ = ["DiskTierStats", "TierCounters"]


class DiskTierStats(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot: what the directory holds (`entries`, `bytes`) and this tier's counters since it opened."""

    entries: int
    bytes: int
    """Bytes of the records (state + index, and each shared block once), the figure the byte limit applies
    to; the same as `stored_bytes`."""
    logical_bytes: int = 0
    """What the entries would take stored whole (each one's whole state record + index)."""
    stored_bytes: int = 0
    """What the directory holds for them (`bytes`)."""
    blocks: int = 0
    """Shared blocks held (each once)."""
    limit_bytes: int
    puts: int
    hits: int
    misses: int
    evictions: int
    replaced: int
    """Entries dropped because a `put` held them whole."""
    rejected: int
    """Entries removed because their records could not be used (damaged, another model, ...)."""
    bytes_written: int
    bytes_read: int
    blocks_written: int = 0
    """Blocks a put wrote (not held yet)."""
    blocks_shared: int = 0
    """Blocks a put found held already (not written)."""
    whole_states: int = 0
    """Puts stored whole although blocks are on (a layout `caches.kvstate` does not cut)."""


class TierCounters:
    """The tier's counters and its last published contents, behind one small lock (see the module)."""

    __slots__ = (
        "_blocks",
        "_blocks_shared",
        "_blocks_written",
        "_bytes",
        "_entries",
        "_evictions",
        "_hits",
        "_lock",
        "_logical",
        "_misses",
        "_puts",
        "_read",
        "_rejected",
        "_replaced",
        "_whole",
        "_written",
        "limit_bytes",
    )

    def __init__(self, limit_bytes: int) -> None:
        self._lock = threading.Lock()
        self.limit_bytes = limit_bytes
        self._entries = self._bytes = 0
        self._puts = self._hits = self._misses = self._evictions = 0
        self._replaced = self._rejected = self._written = self._read = 0
        self._logical = self._blocks = self._blocks_written = self._blocks_shared = self._whole = 0

    def add(
        self,
        *,
        puts: int = 0,
        hits: int = 0,
        misses: int = 0,
        evictions: int = 0,
        replaced: int = 0,
        rejected: int = 0,
        written: int = 0,
        read: int = 0,
        blocks_written: int = 0,
        blocks_shared: int = 0,
        whole: int = 0,
    ) -> None:
        """Count what an operation did (any thread)."""
        with self._lock:
            self._puts += puts
            self._hits += hits
            self._misses += misses
            self._evictions += evictions
            self._replaced += replaced
            self._rejected += rejected
            self._written += written
            self._read += read
            self._blocks_written += blocks_written
            self._blocks_shared += blocks_shared
            self._whole += whole

    def publish(self, entries: int, nbytes: int, logical: int = 0, blocks: int = 0) -> None:
        """What the directory holds now, as a completed transaction left it (the tier's lock held)."""
        with self._lock:
            self._entries, self._bytes, self._logical, self._blocks = entries, nbytes, logical, blocks

    def snapshot(self) -> DiskTierStats:
        """The numbers now: no I/O, and no wait on a write in progress."""
        with self._lock:
            return DiskTierStats(
                entries=self._entries,
                bytes=self._bytes,
                logical_bytes=self._logical,
                stored_bytes=self._bytes,
                blocks=self._blocks,
                limit_bytes=self.limit_bytes,
                puts=self._puts,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                replaced=self._replaced,
                rejected=self._rejected,
                bytes_written=self._written,
                bytes_read=self._read,
                blocks_written=self._blocks_written,
                blocks_shared=self._blocks_shared,
                whole_states=self._whole,
            )
