"""The disk tier: slot states that left RAM (or the process), in a diskcache directory, found by prefix.

The slot hands `put` the serialized state (opaque bytes: state + checkpoints) of every entry its
`PromptCache` evicts, and its own state on close; `find` returns the stored state that keeps the most
of a prompt, so a conversation whose state left RAM, or a restarted process, resumes from disk.

Storage, per entry (key digest `d` = BLAKE2b of fingerprint + tokens; every key and value is a `str`,
`int` or `bytes` that diskcache stores raw; the directory is opened with `RawDisk`, which refuses a
pickled row, so nothing is ever unpickled: such a row is logged and removed):

- `turnstile:r:<d>` the state record: header + tokens + payload + CRC-32 (`disk_format`), a file;
- `turnstile:i:<d>` the index record: the same header and tokens, no payload;
- `turnstile:u:<d>` `"<last use, ns>:<bytes>:<owner>"`, the least-recently-used order, the entry's size and
  the key namespace it is charged to (`disk_usage`; a row of the earlier `"<last use>:<bytes>"` form reads
  as owner "").

With `blocks` (`DiskBlocks`: `Runtime.open(shared_blocks=N)`), a state is stored as blocks of N KV cells
(`caches.disk.cut`): `turnstile:k:<d>` lists the entry's blocks, `turnstile:b:<key>` holds each block once
however many entries list it, and the state record (kind 3) holds the rest. A put writes only the blocks
not held yet, block rows before the state rows that refer to them; a block goes with the last entry that
lists it (the counts are the mirror's, derived from the entries); blocks no entry lists are collected at
open. A state `caches.kvstate` cannot cut is stored whole (logged once per reason).

All of an entry's rows are written and removed together in one transaction (an SQLite write lock: two threads, two
`DiskTier`s or two processes on one directory lose nothing), which also bumps the directory's change
counter and logs the digests it changed (`disk_store`).

In memory (`disk_mirror`), rebuilt at open from three range queries: a token trie of the entries
(`find` and `put` cost depends on the prompt's length, not on the number of entries), the byte total
and the LRU order. Each call first compares the change counter with the one it has seen; if another
object or process wrote, it refreshes the digests the log names (a full reload if the log has a gap).

The byte limit is our own accounting (diskcache's eviction is off; SQLite's pages are not counted):
after each `put`, in its transaction, and at open, the least recently used entries go until the
records' bytes (state + index) fit; with entries of several owners, the least recently used of the owner
furthest over its share (`caches.shares`, weights from `weights`) each time. A write that fails (a full
disk) removes its files, changes nothing.
The counters live outside the write lock (`disk.stats`): `stats()` never waits for a `put`, never does I/O.

A record that is damaged (checksum, truncated, lengths), of another format version, another model
fingerprint or other context settings is removed, logged (`disk_tier.rejected`, with a `reason`) and
treated as a miss: one directory serves one model. A directory that cannot be used at all (read-only,
not a directory, a damaged cache.db) raises `DiskTierUnavailable` at open.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from caches.disk.cut import Cut, DiskBlocks, cut
from caches.disk.entry import Encoded, collect_blocks, encode_entry, rejection, why, write_blocks
from caches.disk.format import (
    Buffer,
    PartsReader,
    Payload,
    StateFormatError,
    payload_parts,
    tokens_to_bytes,
)
from caches.disk.mirror import Item, Mirror
from caches.disk.reads import _Unusable, read_state
from caches.disk.stats import DiskTierStats, TierCounters
from caches.disk.store import BLK, IDX, MAN, REC, STORE_ERRORS, USE, WRITE_ERRORS, TierStore, Txn
from caches.disk.usage import format_usage
from caches.shares import Weights, is_owner, worst_owner
from runtime.errors import DiskTierUnavailable, InvalidConfig, StateLayoutError, UnsafeRecord
from runtime.log import get_logger

__all__ = ["DiskBlocks", "DiskTier", "DiskTierStats", "DiskTierUnavailable"]

log = get_logger(__name__)


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
        blocks: DiskBlocks | None = None,
        mid_put: Callable[[], None] | None = None,
        weights: Weights | None = None,
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
        self.blocks = blocks
        self.weights = weights if weights is not None else Weights()
        self._namespace = f"{fingerprint};{settings if isinstance(settings, str) else settings.decode()}".encode()
        self._whole_reasons: set[str] = set()
        self._store = TierStore(self.directory)
        try:
            with self._lock, self._write():
                if orphans := self._store.sweep_files():
                    log.warning("disk_tier.orphan_files_removed", count=orphans, directory=self.directory)
                self._evict_over_limit(keep=None)
        except STORE_ERRORS as e:
            self._store.close()
            raise DiskTierUnavailable(self.directory, why(e)) from e

    # -- public -------------------------------------------------------------------------------------------

    def put(self, tokens: Sequence[int], payload: Payload, *, owner: str = "") -> bool:
        """Store `payload` (one buffer, or a list of buffers written one after the other) for `tokens`, charged to
        `owner` (a key namespace, `caches.shares`); True if stored.

        Replaces an entry with the same tokens and drops the entries these tokens hold whole (their
        tokens are a prefix of these), as llama-server's prompt cache does. Refuses empty tokens and a
        state that would hold more than the byte limit alone. Then evicts the least recently used over
        the limit. A write that fails is logged (`disk_tier.write_failed`), leaves nothing behind and
        returns False. With `blocks`, only the blocks not held yet are written.
        """
        toks = tuple(tokens)
        if not toks:
            return False
        owner = owner if is_owner(owner) else ""
        tb = tokens_to_bytes(toks)
        pieces = payload_parts(payload)
        e = encode_entry(self._fp, self.settings, toks, tb, pieces, self._cut(toks, pieces))
        if self.limit_bytes and e.held > self.limit_bytes:
            log.warning("disk_tier.too_large", n_tokens=len(toks), nbytes=e.held, limit_bytes=self.limit_bytes)
            return False
        d = self._digest(tb)
        t0 = time.perf_counter()
        try:
            with self._lock:
                written, new = self._put(d, e, owner)
            self._n.add(puts=1, written=written, blocks_written=new, blocks_shared=len(e.item.keys) - new)
        except WRITE_ERRORS as err:
            log.error("disk_tier.write_failed", key=d, n_tokens=len(toks), nbytes=e.held, error=why(err))
            return False
        log.debug(
            "disk_tier.put", key=d, n_tokens=len(toks), nbytes=written, ms=round(1000 * (time.perf_counter() - t0), 2)
        )
        return True

    def _cut(self, toks: tuple[int, ...], pieces: list[Buffer]) -> Cut | None:
        """The payload cut into blocks, or None: no blocks configured, or a state kept whole (logged)."""
        if self.blocks is None:
            return None
        try:
            c = cut(self.blocks, self._namespace, toks, pieces)
            return c if c.keys else None  # less than one block: nothing to share, stored whole
        except StateLayoutError as e:
            first = str(e) not in self._whole_reasons
            self._whole_reasons.add(str(e))
            (log.info if first else log.debug)("disk_tier.whole", reason=str(e), n_tokens=len(toks))
            self._n.add(whole=1)
            return None

    def _put(self, d: str, e: Encoded, owner: str) -> tuple[int, int]:
        """Lock held. Blocks not held yet first, then the entry's rows, then deletes (diskcache removes a
        deleted value's file at once, even inside a transaction that is then rolled back); a failure rolls
        back and removes the new files. (bytes written, blocks written)."""
        item = e.item
        with self._write() as txn:
            stamp = time.time_ns()
            new = write_blocks(self._store, self._fp, self.settings, e, self._m.blocks)
            self._store.put(IDX + d, e.index)
            usage = format_usage(stamp, item.nbytes, owner)
            self._store.put(USE + d, usage)
            if e.manifest is not None:
                self._store.put(MAN + d, e.manifest)
            elif d in self._m and self._m.items[d].keys:
                self._store.delete(MAN + d)
            self._store.put(REC + d, PartsReader(e.parts), read=True)
            txn.changed.add(d)
            olds = self._m.trie.prefixes(item.tokens)
            self._drop_blocks(self._m.add(d, item, usage))
            for od in olds:
                log.debug("disk_tier.replaced", key=od, n_tokens=len(self._m.items[od].tokens))
                self._delete(od)
                self._n.add(replaced=1)
            self._evict_over_limit(keep=d)
            if self._mid_put is not None:
                self._mid_put()
        return item.nbytes + new * item.block_record, new

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
            log.error("disk_tier.read_failed", directory=self.directory, error=why(e))
        self._n.add(misses=1)
        return None

    def peek(self, prompt: Sequence[int], *, better_than: int = 0) -> tuple[int, tuple[int, ...], int] | None:
        """What `find` would read first, from the in-memory index (no state read): (kept, tokens, whole bytes)."""
        try:
            with self._lock:
                self._sync()
                hit = self._m.trie.best(tuple(prompt), better_than)
                item = self._m.items[hit[0]] if hit is not None else None
        except STORE_ERRORS as e:
            log.error("disk_tier.read_failed", directory=self.directory, error=why(e))
            return None
        return (hit[1], item.tokens, item.whole_bytes) if hit is not None and item is not None else None

    def remove(self, tokens: Sequence[int]) -> bool:
        """Remove the entry for exactly these tokens; True if there was one."""
        d = self._digest(tokens_to_bytes(tokens))
        try:
            with self._lock, self._write():
                found = d in self._m
                if found:
                    self._delete(d)
        except STORE_ERRORS as e:
            log.error("disk_tier.write_failed", key=d, n_tokens=len(tokens), error=why(e))
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
            log.error("disk_tier.read_failed", directory=self.directory, error=why(e))

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
        self._n.publish(len(self._m), self._m.total, self._m.logical, len(self._m.blocks))

    def _reload(self) -> None:
        """Lock and transaction held. Rebuild the mirror from the directory, a few range queries; remove
        unusable entries, rows that belong to no entry (a crash of an older version), blocks no entry
        lists (orphans) and entries whose blocks are gone."""
        known = self._m.clear()
        usage = dict(self._store.scan(USE))
        mans = dict(self._store.scan(MAN))
        for key, raw in self._store.scan(IDX):
            d = key[len(IDX) :]
            u = usage.get(USE + d)
            man = mans.get(MAN + d)
            old = known.get(d)
            item = old if old is not None and man is None and not old.keys else self._item(d, raw, man)
            if item is not None and isinstance(u, BaseException):
                self._reject(d, *rejection(u))
            elif item is not None:
                self._m.add(d, item, u)
        for prefix, rows in ((USE, usage.items()), (MAN, mans.items()), (REC, self._store.scan(REC, values=False))):
            for key, _ in rows:
                if key[len(prefix) :] not in self._m:
                    self._store.delete(key)
        present, orphans = collect_blocks(self._store, self._m.blocks)
        if orphans:
            log.warning("disk_tier.orphan_blocks_removed", count=orphans, directory=self.directory)
        for k in [k for k in self._m.blocks if k not in present]:
            self._bad_block(k, "missing", "no block record")

    def _refresh(self, d: str) -> None:
        """Lock and transaction held. Bring one entry in line with its rows (the blocks it no longer lists
        were removed by the writer that changed it)."""
        try:
            raw = self._store.get(IDX + d)
            u = self._store.get(USE + d) if raw is not None else None
            man = self._store.get(MAN + d) if raw is not None else None
        except (UnsafeRecord, OSError) as e:
            self._reject(d, *rejection(e))
            return
        old = self._m.items.get(d)
        item = None
        if raw is not None:
            item = old if old is not None and man is None and not old.keys else self._item(d, raw, man)
        if item is None:
            self._m.drop(d)
        else:
            self._m.add(d, item, u)

    def _item(self, d: str, raw: object, man: object = None) -> Item | None:
        """Lock and transaction held. An index row (and manifest) as an item, or None (the entry rejected)."""
        try:
            return self._m.item(raw, man)
        except (UnsafeRecord, OSError, StateFormatError) as e:
            self._reject(d, *rejection(e))
            return None

    # -- row changes (callers hold self._lock and a transaction) ------------------------------------------

    def _delete(self, d: str) -> None:
        """Remove an entry's rows (and its file), and the blocks only it listed."""
        with self._write() as txn:
            for prefix in (IDX, USE, REC, MAN):
                self._store.delete(prefix + d)
            txn.changed.add(d)
            self._drop_blocks(self._m.drop(d))

    def _drop_blocks(self, keys: list[bytes]) -> None:
        for k in keys:
            self._store.delete(BLK + k.hex())

    def _bad_block(self, k: bytes, reason: str, detail: str) -> None:
        """A block that cannot be used: every entry that lists it goes (logged), and with the last, the block."""
        for d in self._m.users(k):
            self._reject(d, reason, f"block {k.hex()}: {detail}")
        self._store.delete(BLK + k.hex())

    def _evict_over_limit(self, keep: str | None) -> None:
        """Remove the least recently used entries (never `keep`) until the bytes fit."""
        if not self.limit_bytes:
            return
        while self._m.total > self.limit_bytes and (d := self._victim(keep)) is not None:
            row = self._m.usage.get(d)
            self._delete(d)
            self._n.add(evictions=1)
            log.debug("disk_tier.evicted", key=d, nbytes=row and row[1], total=self._m.total, limit=self.limit_bytes)

    def _victim(self, keep: str | None) -> str | None:
        """The next entry to evict (never `keep`): the least recently used, of the owner furthest over its share
        when several owners hold entries."""
        book = self._m.usage
        owners = book.owners
        if len(owners) <= 1:
            return book.oldest(keep)
        heads = {o: h for o in owners if (h := book.oldest(keep, o)) is not None}
        among = sorted(heads, key=lambda o: (book.get(heads[o]) or (0, 0))[0])  # ties: the older entry
        owner = worst_owner({o: self._m.charged(o) for o in owners}, self.limit_bytes, self.weights.of, among)
        return heads[owner] if owner is not None else None

    def _reject(self, d: str, reason: str, detail: str) -> None:
        """Lock held. Remove an unusable entry and say why."""
        self._n.add(rejected=1)
        log.warning("disk_tier.rejected", reason=reason, detail=detail, key=d, directory=self.directory)
        self._delete(d)

    # -- state records ------------------------------------------------------------------------------------

    def _read_state(self, d: str, item: Item) -> memoryview | None:
        """Read and check an entry's state (and its blocks), without the lock; None if unusable: then, in
        line with the directory, the entry (or every entry using a bad block) is removed if it is still there."""
        try:
            payload, size = read_state(self._store, d, item, self._fp, self.settings)
        except _Unusable as e:
            with self._lock, self._write():
                if e.block is not None and e.block in self._m.blocks:
                    self._bad_block(e.block, e.reason, e.detail)
                elif e.block is None and self._m.items.get(d) is item:  # in line with the directory: still
                    self._reject(d, e.reason, e.detail)  # the entry we read (not one written since)
            return None
        self._n.add(hits=1, read=size)
        return payload

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
