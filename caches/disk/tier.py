"""The disk tier: slot states that left RAM (or the process), in a diskcache directory, found by prefix.

The slot hands `put` the serialized state (opaque bytes: state + checkpoints) of every entry its
`PromptCache` evicts, and its own state on close; `find` returns the stored state that keeps the most
of a prompt, so a conversation whose state left RAM, or a restarted process, resumes from disk.

Storage, per entry (key digest `d` = BLAKE2b of fingerprint + tokens; every key and value is a `str`,
`int` or `bytes` that diskcache stores raw; the directory is opened with `RawDisk`, which refuses a
pickled row, so nothing is ever unpickled: such a row is logged and removed):

- `turnstile:r:<d>` the state record: header + tokens + payload + CRC-32 (`disk_format`), a file;
- `turnstile:i:<d>` the index record: the same header and tokens, no payload;
- `turnstile:u:<d>` `"<last use, ns>:<bytes>"`, the least-recently-used order and the entry's size.

All three are written and removed together in one transaction (an SQLite write lock: two threads, two
`DiskTier`s or two processes on one directory lose nothing), which also bumps the directory's change
counter and logs the digests it changed (`disk_store`).

In memory (`disk_mirror`), rebuilt at open from three range queries: a token trie of the entries
(`find` and `put` cost depends on the prompt's length, not on the number of entries), the byte total
and the LRU order. Each call first compares the change counter with the one it has seen; if another
object or process wrote, it refreshes the digests the log names (a full reload if the log has a gap).

The byte limit is our own accounting (diskcache's eviction is off; SQLite's pages are not counted):
after each `put`, in its transaction, and at open, the least recently used entries go until the
records' bytes (state + index) fit. A write that fails (a full disk) removes its files, changes nothing.
The counters live outside the write lock (`disk.stats`): `stats()` never waits for a `put`, never does I/O.

A record that is damaged (checksum, truncated, lengths), of another format version, another model
fingerprint or other context settings is removed, logged (`disk_tier.rejected`, with a `reason`) and
treated as a miss: one directory serves one model. A directory that cannot be used at all (read-only,
not a directory, a damaged cache.db) raises `DiskTierUnavailable` at open.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from caches.disk.format import (
    KIND_INDEX,
    KIND_STATE,
    Buffer,
    PartsReader,
    Payload,
    StateFormatError,
    decode,
    encode,
    encode_parts,
    payload_parts,
    tokens_to_bytes,
)
from caches.disk.mirror import Item, Mirror
from caches.disk.stats import DiskTierStats, TierCounters
from caches.disk.store import IDX, REC, STORE_ERRORS, USE, WRITE_ERRORS, TierStore, Txn
from caches.disk.usage import format_usage
from runtime.errors import DiskTierUnavailable, InvalidConfig, MissingValueFile, UnsafeRecord
from runtime.log import get_logger

__all__ = ["DiskTier", "DiskTierStats", "DiskTierUnavailable"]

log = get_logger(__name__)


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _rejection(e: BaseException) -> tuple[str, str]:
    """(reason, detail) for a row that cannot be used."""
    if isinstance(e, StateFormatError):
        return e.reason, str(e)
    if isinstance(e, MissingValueFile):
        return "missing", str(e)
    return ("unsafe" if isinstance(e, UnsafeRecord) else "unreadable"), _why(e)


class DiskTier:
    """Slot states on disk, keyed by model fingerprint + tokens, with a byte limit and LRU eviction.

    Thread-safe; writes happen in the caller's thread (the slot's worker), never in the event loop.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fingerprint: str,
        settings: str | bytes = "",
        limit_bytes: int = 4 << 30,
        mid_put: Callable[[], None] | None = None,
    ) -> None:
        """Open (or create) the tier in `directory`; `limit_bytes` 0: no limit.

        `mid_put` (for tests) is called inside every `put`'s write transaction once its rows are written and
        before they commit, with the tier's lock held: a test holds a put mid-write with it.

        Loads the index, removes what this tier cannot use and files that belong to no entry (a writer killed
        mid-put), and evicts down to `limit_bytes`. Raises `DiskTierUnavailable` if the directory cannot be
        used (read-only, not a directory, damaged).
        """
        if limit_bytes < 0:
            raise InvalidConfig("limit_bytes must be >= 0 (0: no limit)")
        self.directory = os.fspath(directory)
        self.fingerprint = fingerprint
        self.settings = settings
        self.limit_bytes = limit_bytes
        self._fp = fingerprint.encode("utf-8")
        self._lock = threading.RLock()
        self._m = Mirror(self._fp, settings)
        self._seq = -1  # the change counter the in-memory index reflects; -1: reload
        self._n = TierCounters(limit_bytes)
        self._mid_put = mid_put
        self._store = TierStore(self.directory)
        try:
            with self._lock, self._write():
                if orphans := self._store.sweep_files():
                    log.warning("disk_tier.orphan_files_removed", count=orphans, directory=self.directory)
                self._evict_over_limit(keep=None)
        except STORE_ERRORS as e:
            self._store.close()
            raise DiskTierUnavailable(self.directory, _why(e)) from e

    # -- public -------------------------------------------------------------------------------------------

    def put(self, tokens: Sequence[int], payload: Payload) -> bool:
        """Store `payload` (one buffer, or a list of buffers written one after the other) for `tokens`; True if stored.

        Replaces an entry with the same tokens and drops the entries these tokens hold whole (their
        tokens are a prefix of these), as llama-server's prompt cache does. Refuses empty tokens and a
        record larger than the byte limit alone. Then evicts the least recently used over the limit.
        A write that fails is logged (`disk_tier.write_failed`), leaves nothing behind and returns False.
        """
        toks = tuple(tokens)
        if not toks:
            return False
        tb = tokens_to_bytes(toks)
        pieces = payload_parts(payload)
        parts = encode_parts(KIND_STATE, self._fp, self.settings, toks, pieces, token_bytes=tb)
        plen = sum(len(p) for p in pieces)
        index = encode(KIND_INDEX, self._fp, self.settings, toks, payload_len=plen, token_bytes=tb)
        nbytes = sum(len(p) for p in parts) + len(index)
        if self.limit_bytes and nbytes > self.limit_bytes:
            log.warning("disk_tier.too_large", n_tokens=len(toks), nbytes=nbytes, limit_bytes=self.limit_bytes)
            return False
        d = self._digest(tb)
        t0 = time.perf_counter()
        try:
            with self._lock:
                self._put(d, toks, parts, index, nbytes)
            self._n.add(puts=1, written=nbytes)
        except WRITE_ERRORS as e:
            log.error("disk_tier.write_failed", key=d, n_tokens=len(toks), nbytes=nbytes, error=_why(e))
            return False
        log.debug(
            "disk_tier.put", key=d, n_tokens=len(toks), nbytes=nbytes, ms=round(1000 * (time.perf_counter() - t0), 2)
        )
        return True

    def _put(self, d: str, toks: tuple[int, ...], parts: list[Buffer], index: bytes, nbytes: int) -> None:
        """Lock held. Write first, then delete (diskcache removes a deleted value's file at once, even
        inside a transaction that is then rolled back); a failure rolls back and removes the new files."""
        with self._write() as txn:
            stamp = time.time_ns()
            self._store.put(IDX + d, index)
            self._store.put(USE + d, format_usage(stamp, nbytes))
            self._store.put(REC + d, PartsReader(parts), read=True)
            txn.changed.add(d)
            for od in self._m.trie.prefixes(toks):
                log.debug("disk_tier.replaced", key=od, n_tokens=len(self._m.items[od].tokens))
                self._delete(od)
                self._n.add(replaced=1)
            self._m.add(d, Item(toks, nbytes), format_usage(stamp, nbytes))
            self._evict_over_limit(keep=d)
            if self._mid_put is not None:
                self._mid_put()

    def find(self, prompt: Sequence[int], *, better_than: int = 0) -> tuple[list[int], memoryview] | None:
        """The stored (tokens, payload) that keeps the most of `prompt`, or None.

        The payload is a read-only view of the one buffer the record was read into (no other copy).

        Candidates keep at least a quarter of themselves (lcp / their length >= 0.25, as llama-server's
        prompt cache) and more than `better_than` tokens of the prompt. The most kept tokens wins; among
        equals, the larger kept fraction (the shorter entry), then the smaller digest. A candidate whose
        record fails its checks is removed and the next one tried. `disk_index.scan_rank` is this rule as
        a scan over every entry (the reference the index is tested against).
        """
        want = tuple(prompt)  # the index holds tuples: compare like with like
        try:
            for attempt in itertools.count():  # each failed attempt removes its entry
                with self._lock:
                    self._sync()
                    hit = self._m.trie.best(want, better_than) if attempt <= len(self._m) else None
                    if hit is None:
                        break
                    d, kept = hit
                    item = self._m.items[d]
                payload = self._read_state(d, item)
                if payload is not None:
                    self._touch(d)
                    log.debug("disk_tier.hit", key=d, n_tokens=len(item.tokens), kept=kept)
                    return list(item.tokens), payload
        except STORE_ERRORS as e:
            log.error("disk_tier.read_failed", directory=self.directory, error=_why(e))
        self._n.add(misses=1)
        return None

    def peek(self, prompt: Sequence[int], *, better_than: int = 0) -> tuple[int, tuple[int, ...], int] | None:
        """What `find` would read first, from the in-memory index (no state read): (kept, its tokens, its bytes)."""
        try:
            with self._lock:
                self._sync()
                hit = self._m.trie.best(tuple(prompt), better_than)
                item = self._m.items[hit[0]] if hit is not None else None
        except STORE_ERRORS as e:
            log.error("disk_tier.read_failed", directory=self.directory, error=_why(e))
            return None
        return (hit[1], item.tokens, item.nbytes) if hit is not None and item is not None else None

    def remove(self, tokens: Sequence[int]) -> bool:
        """Remove the entry for exactly these tokens; True if there was one."""
        d = self._digest(tokens_to_bytes(tokens))
        try:
            with self._lock, self._write():
                found = d in self._m
                if found:
                    self._delete(d)
        except STORE_ERRORS as e:
            log.error("disk_tier.write_failed", key=d, n_tokens=len(tokens), error=_why(e))
            return False
        return found

    def __len__(self) -> int:
        with self._lock:
            self._sync_quietly()
            return len(self._m)

    @property
    def nbytes(self) -> int:
        """Bytes of the records (state + index) the directory holds for this tier."""
        with self._lock:
            self._sync_quietly()
            return self._m.total

    def stats(self) -> DiskTierStats:
        """The counters and the contents as of this tier's last completed operation (`disk.stats`): no I/O,
        and no wait for a write in progress, so the event loop may call it at any time."""
        return self._n.snapshot()

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> DiskTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- staying in line with the directory (callers hold self._lock) -----------------------------------

    def _digest(self, token_bytes: bytes) -> str:
        fp = self._fp
        return hashlib.blake2b(len(fp).to_bytes(4, "little") + fp + token_bytes, digest_size=20).hexdigest()

    def _sync(self) -> None:
        """Lock held. If anyone wrote since we last looked, catch up (inside a write transaction, so that
        what we read is one consistent snapshot)."""
        if self._store.txn is None and self._store.seq() != self._seq:
            with self._write():
                pass

    def _sync_quietly(self) -> None:
        try:
            self._sync()
        except STORE_ERRORS as e:  # keep the last view
            log.error("disk_tier.read_failed", directory=self.directory, error=_why(e))

    @contextlib.contextmanager
    def _write(self) -> Iterator[Txn]:
        """Lock held. A write transaction that starts in line with the directory; nested calls share it."""
        if self._store.txn is not None:
            yield self._store.txn
            return
        try:
            with self._store.write() as txn:
                if txn.base != self._seq:
                    changed = self._store.changes(self._seq, txn.base)
                    if changed is None:
                        self._reload()
                    else:
                        for d in sorted(changed):
                            self._refresh(d)
                    self._seq = txn.base
                yield txn
        except BaseException:
            self._seq = -1  # the in-memory index may hold what was rolled back: reload next time
            raise
        self._seq = txn.seq
        self._n.publish(len(self._m), self._m.total)

    def _reload(self) -> None:
        """Lock and transaction held. Rebuild the mirror from the directory, three range queries; remove
        unusable entries and rows that belong to no entry (a crash of an older version)."""
        known = self._m.clear()
        usage = dict(self._store.scan(USE))
        for key, raw in self._store.scan(IDX):
            d = key[len(IDX) :]
            u = usage.get(USE + d)
            item = known.get(d) or self._item(d, raw)
            if item is not None and isinstance(u, BaseException):
                self._reject(d, *_rejection(u))
            elif item is not None:
                self._m.add(d, item, u)
        for prefix, rows in ((USE, usage.items()), (REC, self._store.scan(REC, values=False))):
            for key, _ in rows:
                if key[len(prefix) :] not in self._m:
                    self._store.delete(key)

    def _refresh(self, d: str) -> None:
        """Lock and transaction held. Bring one entry in line with its rows."""
        try:
            raw = self._store.get(IDX + d)
            u = self._store.get(USE + d) if raw is not None else None
        except (UnsafeRecord, OSError) as e:
            self._reject(d, *_rejection(e))
            return
        item = None if raw is None else self._m.items.get(d) or self._item(d, raw)
        if item is None:
            self._m.drop(d)
        else:
            self._m.add(d, item, u)

    def _item(self, d: str, raw: object) -> Item | None:
        """Lock and transaction held. An index row as an item, or None (the entry rejected)."""
        try:
            return self._m.item(raw)
        except (UnsafeRecord, OSError, StateFormatError) as e:
            self._reject(d, *_rejection(e))
            return None

    # -- row changes (callers hold self._lock and a transaction) ------------------------------------------

    def _delete(self, d: str) -> None:
        """Remove an entry's three rows (and its file)."""
        with self._write() as txn:
            for prefix in (IDX, USE, REC):
                self._store.delete(prefix + d)
            txn.changed.add(d)
            self._m.drop(d)

    def _evict_over_limit(self, keep: str | None) -> None:
        """Remove the least recently used entries (never `keep`) until the bytes fit."""
        if not self.limit_bytes:
            return
        for d in self._m.usage.victims(self.limit_bytes, keep):
            row = self._m.usage.get(d)
            self._delete(d)
            self._n.add(evictions=1)
            log.debug("disk_tier.evicted", key=d, nbytes=row and row[1], total=self._m.total, limit=self.limit_bytes)

    def _reject(self, d: str, reason: str, detail: str) -> None:
        """Lock held. Remove an unusable entry and say why."""
        self._n.add(rejected=1)
        log.warning("disk_tier.rejected", reason=reason, detail=detail, key=d, directory=self.directory)
        self._delete(d)

    # -- state records ------------------------------------------------------------------------------------

    def _read_state(self, d: str, item: Item) -> memoryview | None:
        """Read and check an entry's state record, without the lock; None (entry removed) if unusable."""
        try:
            handle: Any = self._store.get(REC + d, read=True)
            why = ("missing", "no state record")
        except (UnsafeRecord, MissingValueFile, OSError) as e:
            handle, why = None, _rejection(e)
        if handle is None:
            with self._lock, self._write():
                if d in self._m:  # in line with the directory: the index row is there
                    self._reject(d, *why)
            return None
        f: Any = io.BytesIO(handle) if isinstance(handle, bytes) else handle  # a RecordFile
        try:
            with f:
                size = len(handle) if isinstance(handle, bytes) else os.fstat(f.fileno()).st_size
                rec = decode(f, size, kind=KIND_STATE, fingerprint=self._fp, settings=self.settings, tokens=item.tokens)
        except (StateFormatError, OSError) as e:
            with self._lock, self._write():
                self._reject(d, *_rejection(e))
            return None
        self._n.add(hits=1, read=size)
        return rec.payload

    def _touch(self, d: str) -> None:
        """Mark an entry used now (least-recently-used order), if it is still there."""
        with self._lock, self._write() as txn:
            try:
                raw = self._store.get(USE + d)
            except UnsafeRecord as e:
                self._reject(d, "unsafe", str(e))
                return
            if isinstance(raw, str) and ":" in raw:
                new = f"{time.time_ns()}:{raw.split(':', 1)[1]}"
                self._store.put(USE + d, new)
                txn.changed.add(d)
                self._m.set_usage(d, new)
