"""The disk tier: slot states that left RAM (or the process), in a diskcache directory, found by prefix.

The slot hands `put` the serialized state (opaque bytes: state + checkpoints) of every entry its
`PromptCache` evicts, and its own state on close; `find` returns the stored state that keeps the most
of a prompt, so a conversation whose state left RAM, or a restarted process, resumes from disk.

Storage, per entry (key digest `d` = BLAKE2b of fingerprint + tokens; every key and value is a `str`,
`int` or `bytes` that diskcache stores raw, nothing is pickled):

- `turnstile:r:<d>` the state record: header + tokens + payload + CRC-32 (`disk_format`), a file;
- `turnstile:i:<d>` the index record: the same header and tokens, no payload, so a lookup reads only
  these (once per process: they are kept in memory, keyed by digest, and refreshed from the key list);
- `turnstile:u:<d>` `"<last use, ns>:<bytes>"`, the least-recently-used order and the entry's size.

All three are written and removed together inside one diskcache transaction (an SQLite write lock, so
two threads, two `DiskTier`s or two processes on one directory lose nothing). The byte limit is our own
accounting: after each `put`, in the same transaction, the least recently used entries go until the
records' bytes (state + index) fit; diskcache's own eviction is off (`eviction_policy="none"`). SQLite's
own pages are not counted.

A record that is damaged (checksum, truncated, lengths), of another format version, another model
fingerprint or other context settings is removed, logged (`disk_tier.rejected`, with a `reason`) and
treated as a miss. One directory serves one model: a tier removes the entries it cannot use.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import diskcache

from caches.disk_format import (
    KIND_INDEX,
    KIND_STATE,
    PartsReader,
    RecordError,
    decode,
    encode,
    encode_parts,
    record_size,
    tokens_to_bytes,
)
from caches.tokens import keeps_enough, lcp
from sessions.errors import InvalidConfig
from sessions.log import get_logger

__all__ = ["DiskTier", "DiskTierStats"]

log = get_logger(__name__)

_PREFIX = "turnstile:"
_I, _R, _U = "turnstile:i:", "turnstile:r:", "turnstile:u:"


@dataclass(frozen=True, slots=True)
class DiskTierStats:
    """A snapshot: what the directory holds (`entries`, `bytes`) and this object's counters."""

    entries: int
    bytes: int
    limit_bytes: int
    puts: int
    hits: int
    misses: int
    evictions: int
    replaced: int
    """Entries dropped because a `put` held them whole."""
    rejected: int
    bytes_written: int
    bytes_read: int


@dataclass(frozen=True, slots=True)
class _Item:
    tokens: tuple[int, ...]
    nbytes: int
    """State + index record bytes when the index was read (the usage key has the current figure)."""


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
    ) -> None:
        """Open (or create) the tier in `directory`; `limit_bytes` 0: no limit."""
        if limit_bytes < 0:
            raise InvalidConfig("limit_bytes must be >= 0 (0: no limit)")
        self.directory = os.fspath(directory)
        self.fingerprint = fingerprint
        self.settings = settings
        self.limit_bytes = limit_bytes
        self._fp = fingerprint.encode("utf-8")
        self._cache: Any = diskcache.Cache(self.directory, eviction_policy="none", cull_limit=0, statistics=False)
        self._lock = threading.RLock()
        self._index: dict[str, _Item] = {}
        self._puts = self._hits = self._misses = self._evictions = 0
        self._replaced = self._rejected = self._written = self._read = 0
        with self._lock:
            self._sync()

    # -- public -------------------------------------------------------------------------------------------

    def put(self, tokens: Sequence[int], payload: bytes) -> bool:
        """Store `payload` for `tokens`; True if stored.

        Replaces an entry with the same tokens and drops the entries these tokens hold whole (their
        tokens are a prefix of these), as llama-server's prompt cache does. Refuses empty tokens and a
        record larger than the byte limit alone. Then evicts the least recently used over the limit.
        """
        toks = tuple(tokens)
        if not toks:
            return False
        tb = tokens_to_bytes(toks)
        parts = encode_parts(KIND_STATE, self._fp, self.settings, toks, payload, token_bytes=tb)
        index = encode(KIND_INDEX, self._fp, self.settings, toks, payload_len=len(payload), token_bytes=tb)
        state_len = sum(len(p) for p in parts)
        nbytes = state_len + len(index)
        if self.limit_bytes and nbytes > self.limit_bytes:
            log.warning("disk_tier.too_large", n_tokens=len(toks), nbytes=nbytes, limit_bytes=self.limit_bytes)
            return False
        d = self._digest(tb)
        t0 = time.perf_counter()
        try:
            self._put(d, toks, parts, index, nbytes)
        except (OSError, diskcache.Timeout) as e:
            log.error(
                "disk_tier.write_failed", key=d, n_tokens=len(toks), nbytes=nbytes, error=f"{type(e).__name__}: {e}"
            )
            return False
        log.debug(
            "disk_tier.put", key=d, n_tokens=len(toks), nbytes=nbytes, ms=round(1000 * (time.perf_counter() - t0), 2)
        )
        return True

    def _put(self, d: str, toks: tuple[int, ...], parts: list[bytes | memoryview], index: bytes, nbytes: int) -> None:
        """Lock and transaction taken here. Write first (a failed write deletes nothing: diskcache
        removes a deleted value's file at once, even inside a transaction that is then rolled back)."""
        with self._lock, self._cache.transact():
            keys = self._sync()
            self._sweep_orphans(keys)
            self._cache.set(_I + d, index)
            self._cache.set(_U + d, f"{time.time_ns()}:{nbytes}")
            self._cache.set(_R + d, PartsReader(parts), read=True)  # last: its file outlives a rollback
            for od, item in list(self._index.items()):
                n = len(item.tokens)
                if od != d and n < len(toks) and toks[:n] == item.tokens:
                    self._delete(od)
                    self._replaced += 1
                    log.debug("disk_tier.replaced", key=od, n_tokens=n)
            self._index[d] = _Item(toks, nbytes)
            self._evict_over_limit(keep=d)
            self._puts += 1
            self._written += nbytes

    def find(self, prompt: Sequence[int], *, better_than: int = 0) -> tuple[list[int], bytes] | None:
        """The stored (tokens, payload) that keeps the most of `prompt`, or None.

        Candidates keep at least a quarter of themselves (lcp / their length >= 0.25, as llama-server's
        prompt cache) and more than `better_than` tokens of the prompt. The most kept tokens wins; among
        equals, the larger kept fraction (the shorter entry). A candidate whose record fails its checks is
        removed and the next one tried.
        """
        want = tuple(prompt)  # the index holds tuples: compare like with like
        with self._lock:
            self._sync()
            ranked: list[tuple[int, int, str, _Item]] = []
            for d, item in self._index.items():
                n = lcp(item.tokens, want)
                if n <= better_than or not keeps_enough(n, len(item.tokens)):
                    continue
                ranked.append((-n, len(item.tokens), d, item))
        ranked.sort(key=lambda r: r[:3])
        for _neg, _, d, item in ranked:
            payload = self._read_state(d, item)
            if payload is not None:
                self._touch(d)
                log.debug("disk_tier.hit", key=d, n_tokens=len(item.tokens), kept=-_neg)
                return list(item.tokens), payload
        with self._lock:
            self._misses += 1
        return None

    def remove(self, tokens: Sequence[int]) -> bool:
        """Remove the entry for exactly these tokens; True if there was one."""
        d = self._digest(tokens_to_bytes(tokens))
        with self._lock, self._cache.transact():
            found = (_I + d) in self._cache
            self._delete(d)
        return found

    def __len__(self) -> int:
        with self._lock:
            self._sync()
            return len(self._index)

    @property
    def nbytes(self) -> int:
        """Bytes of the records (state + index) the directory holds for this tier."""
        with self._lock:
            self._sync()
            return sum(nbytes for _, nbytes in self._usage().values())

    def stats(self) -> DiskTierStats:
        with self._lock:
            self._sync()
            usage = self._usage()
        return DiskTierStats(
            entries=len(usage),
            bytes=sum(n for _, n in usage.values()),
            limit_bytes=self.limit_bytes,
            puts=self._puts,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            replaced=self._replaced,
            rejected=self._rejected,
            bytes_written=self._written,
            bytes_read=self._read,
        )

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> DiskTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (callers hold self._lock where noted) ----------------------------------------------

    def _digest(self, token_bytes: bytes) -> str:
        h = hashlib.blake2b(digest_size=20)
        h.update(len(self._fp).to_bytes(4, "little"))
        h.update(self._fp)
        h.update(token_bytes)
        return h.hexdigest()

    def _keys(self) -> list[str]:
        return [k for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(_PREFIX)]

    def _sync(self) -> list[str]:
        """Lock held. Bring the in-memory index in line with the directory; return our keys."""
        keys = self._keys()
        present = {k[len(_I) :] for k in keys if k.startswith(_I)}
        for d in [d for d in self._index if d not in present]:
            del self._index[d]
        for d in sorted(present - self._index.keys()):
            raw = self._cache.get(_I + d)
            if raw is None:  # removed since the key list was read
                continue
            try:
                if not isinstance(raw, bytes):
                    raise RecordError("kind", f"a {type(raw).__name__} value")
                rec = decode(io.BytesIO(raw), len(raw), kind=KIND_INDEX, fingerprint=self._fp, settings=self.settings)
            except RecordError as e:
                self._reject(d, e.reason, str(e))
                continue
            state_len = record_size(KIND_STATE, self._fp, self.settings, len(rec.tokens), rec.payload_len)
            self._index[d] = _Item(rec.tokens, state_len + len(raw))
        return keys

    def _sweep_orphans(self, keys: list[str]) -> None:
        """Lock and transaction held. Remove state/usage keys whose index record is gone (a crash)."""
        present = {k[len(_I) :] for k in keys if k.startswith(_I)}
        for k in keys:
            if not k.startswith(_I) and k[len(_R) :] not in present:
                self._cache.delete(k)

    def _usage(self) -> dict[str, tuple[int, int]]:
        """Lock held. digest -> (last use in ns, bytes), from the usage keys (the index's size if absent)."""
        out: dict[str, tuple[int, int]] = {}
        for d, item in self._index.items():
            raw = self._cache.get(_U + d)
            stamp, nbytes = 0, item.nbytes
            if isinstance(raw, str) and raw.count(":") == 1:
                a, b = raw.split(":")
                if a.isdigit() and b.isdigit():
                    stamp, nbytes = int(a), int(b)
            out[d] = (stamp, nbytes)
        return out

    def _evict_over_limit(self, keep: str) -> None:
        """Lock and transaction held. Remove the least recently used entries until the bytes fit."""
        if not self.limit_bytes:
            return
        usage = self._usage()
        total = sum(n for _, n in usage.values())
        for d in sorted(usage, key=lambda d: (usage[d][0], d)):
            if total <= self.limit_bytes:
                break
            if d == keep:
                continue
            total -= usage[d][1]
            self._delete(d)
            self._evictions += 1
            log.debug("disk_tier.evicted", key=d, nbytes=usage[d][1], total=total, limit=self.limit_bytes)

    def _delete(self, d: str) -> None:
        """Lock held. Remove an entry's three keys in one transaction."""
        with self._cache.transact():
            for prefix in (_I, _U, _R):
                self._cache.delete(prefix + d)
        self._index.pop(d, None)

    def _reject(self, d: str, reason: str, detail: str) -> None:
        """Lock held. Remove an unusable entry and say why."""
        self._rejected += 1
        log.warning("disk_tier.rejected", reason=reason, detail=detail, key=d, directory=self.directory)
        self._delete(d)

    def _read_state(self, d: str, item: _Item) -> bytes | None:
        """Read and check an entry's state record, without the lock; None (entry removed) if unusable."""
        try:
            handle = self._cache.get(_R + d, read=True)
        except OSError as e:
            handle, error = None, f"{type(e).__name__}: {e}"
        else:
            error = "no state record"
        if handle is None:
            with self._lock:
                if (_I + d) in self._cache:
                    self._reject(d, "missing", error)
                else:  # removed by another thread or process meanwhile
                    self._index.pop(d, None)
            return None
        f: BinaryIO = io.BytesIO(handle) if isinstance(handle, bytes) else handle
        try:
            with f:
                size = len(handle) if isinstance(handle, bytes) else os.fstat(f.fileno()).st_size
                rec = decode(f, size, kind=KIND_STATE, fingerprint=self._fp, settings=self.settings, tokens=item.tokens)
        except (RecordError, OSError) as e:
            with self._lock:
                self._reject(d, e.reason if isinstance(e, RecordError) else "unreadable", str(e))
            return None
        with self._lock:
            self._read += size
            self._hits += 1
        return rec.payload

    def _touch(self, d: str) -> None:
        """Mark an entry used now (least-recently-used order), if it is still there."""
        with self._lock, self._cache.transact():
            raw = self._cache.get(_U + d)
            if isinstance(raw, str) and ":" in raw:
                self._cache.set(_U + d, f"{time.time_ns()}:{raw.split(':', 1)[1]}")
