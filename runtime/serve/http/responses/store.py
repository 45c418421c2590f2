"""The stored responses of the Responses API: bounded, least recently used evicted, persistent in a directory.

A stored response is a revision of a conversation. Its `Record` names the session that holds the
conversation (in the Runtime's session store) and how many of that session's messages are this response's
(`upto`): the history up to and including its reply. A continuation (`previous_response_id`) of the newest
revision of a session continues that session in place (`claim`); any other continuation, or a second one of
the same revision, branches into a new session that copies the prefix. The parent's messages are never
changed: a session is only ever extended past the revisions that still point into it.

Invariants: at most `max_responses` records and `max_bytes` bytes of records (each record's size is its
encoded size, which is its file's size on disk); the least recently used (created or read) go first. A
session no live record points into (and that no running request has claimed) is handed back by `put` and
`delete` for the caller to delete from the session store. Records are tenant-keyed: another tenant's id is
"not found", exactly as an unknown one. Files are msgspec JSON, written to a temporary name and renamed;
a damaged file is logged and removed at startup, never half-read. Thread-safe (one lock): the HTTP app
calls it from worker threads.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from runtime.errors import InvalidConfig, ResponseNotFound
from runtime.log import get_logger

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_RESPONSES", "KeyStats", "Record", "ResponseStore", "StoreStats"]

log = get_logger(__name__)

DEFAULT_MAX_RESPONSES = 10_000
DEFAULT_MAX_BYTES = 256 << 20
_EVICTED_MEMORY = 4096  # evicted ids remembered, for a 404 that says "evicted"
_ID = re.compile(r"resp_[0-9a-f]{48}")


class Record(msgspec.Struct, kw_only=True):
    """One stored response: the response object as served, its input items, and where its conversation is."""

    id: str
    tenant: str
    session: str  # the session holding the conversation
    upto: int  # that session's first `upto` messages are this response's history, its reply last
    system: str | None = None  # the system prompt from the conversation's leading system input messages
    response: dict[str, Any]  # the response object (GET /v1/responses/{id})
    items: list[dict[str, Any]]  # this request's input items (GET .../input_items)
    created: float = msgspec.field(default_factory=time.time)


class KeyStats(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant's (API key name's) share of the store: responses and bytes held, responses evicted."""

    responses: int = 0
    bytes: int = 0
    evicted: int = 0


class StoreStats(msgspec.Struct, frozen=True, kw_only=True):
    responses: int
    bytes: int
    evicted: int
    max_responses: int
    max_bytes: int
    by_key: dict[str, KeyStats] = msgspec.field(default_factory=dict)  # key name (never the key) -> its share


@dataclass
class _Entry:
    tenant: str
    session: str
    upto: int
    size: int


_decoder = msgspec.json.Decoder(Record)


class ResponseStore:
    """Records by id, in LRU order, in memory or in `directory` (None: memory only, nothing survives)."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        max_responses: int = DEFAULT_MAX_RESPONSES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        for name, value in (("max_responses", max_responses), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfig(f"{name} must be an int >= 1, not {value!r}")
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.directory = None if directory is None else Path(directory)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._memory: dict[str, bytes] = {}  # the records, when there is no directory
        self._evicted: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._claimed: set[str] = set()  # sessions a running request continues in place
        self._bytes = 0
        self.evictions = 0
        self._evictions_by_key: Counter[str] = Counter()  # per tenant (key name): evicted, held, bytes held
        self._held_by_key: Counter[str] = Counter()
        self._bytes_by_key: Counter[str] = Counter()
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._load()

    # --- reading -------------------------------------------------------------------------------------

    def get(self, tenant: str, response_id: str) -> Record:
        """The record (now the most recently used); ResponseNotFound for an unknown, evicted or foreign id."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or entry.tenant != tenant:
                raise ResponseNotFound(response_id, evicted=(tenant, response_id) in self._evicted)
            self._entries.move_to_end(response_id)
            raw = self._read(response_id)
            if self.directory is not None:
                os.utime(self._path(response_id))  # the LRU order survives a restart (mtime)
        return _decoder.decode(raw)

    def stats(self) -> StoreStats:
        """The counters, read under the lock (consistent with each other)."""
        with self._lock:
            return self.gauges()

    def gauges(self) -> StoreStats:
        """`stats()` without taking the lock (copies of counters kept as records come and go), so that a
        /metrics scrape never waits for a record being written; each number is current, together they may
        be one write apart."""
        return StoreStats(
            responses=len(self._entries),
            bytes=self._bytes,
            evicted=self.evictions,
            max_responses=self.max_responses,
            max_bytes=self.max_bytes,
            by_key=self._by_key(),
        )

    def _by_key(self) -> dict[str, KeyStats]:
        held, size, gone = dict(self._held_by_key), dict(self._bytes_by_key), dict(self._evictions_by_key)
        return {
            n: KeyStats(responses=held.get(n, 0), bytes=size.get(n, 0), evicted=gone.get(n, 0))
            for n in sorted(set(held) | set(gone))
        }

    # --- continuing ----------------------------------------------------------------------------------

    def claim(self, record: Record) -> bool:
        """True if a continuation of `record` may extend its session in place (the record is the newest
        revision in it and nobody else claimed it); the caller then `put`s or `release`s."""
        with self._lock:
            if record.session in self._claimed:
                return False
            newest = max((e.upto for e in self._entries.values() if e.session == record.session), default=-1)
            if newest != record.upto:
                return False
            self._claimed.add(record.session)
            return True

    def release(self, session: str) -> list[str]:
        """Drop a claim (the continuation failed); the session back for deletion if nothing points into it."""
        with self._lock:
            self._claimed.discard(session)
            return self._orphans({session})

    # --- writing -------------------------------------------------------------------------------------

    def put(self, record: Record) -> list[str]:
        """Store a record (releasing its session's claim), evict past the limits; the sessions to delete."""
        raw = msgspec.json.encode(record)
        with self._lock:
            self._claimed.discard(record.session)
            touched = {record.session}
            if len(raw) > self.max_bytes:
                log.warning("responses.too_large", response_id=record.id, bytes=len(raw), limit=self.max_bytes)
                return self._orphans(touched)
            self._write(record.id, raw)
            self._add(record.id, _Entry(record.tenant, record.session, record.upto, len(raw)))
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                victim, entry = next(iter(self._entries.items()))
                self._remove(victim)
                self._evicted[entry.tenant, victim] = None
                while len(self._evicted) > _EVICTED_MEMORY:
                    self._evicted.popitem(last=False)
                self.evictions += 1
                self._evictions_by_key[entry.tenant] += 1
                touched.add(entry.session)
                log.info("responses.evicted", response_id=victim, bytes=entry.size)
            return self._orphans(touched)

    def delete(self, tenant: str, response_id: str) -> list[str]:
        """Delete a record (ResponseNotFound as `get`); the sessions to delete."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or entry.tenant != tenant:
                raise ResponseNotFound(response_id, evicted=(tenant, response_id) in self._evicted)
            self._remove(response_id)
            return self._orphans({entry.session})

    # --- inside the lock -----------------------------------------------------------------------------

    def _orphans(self, sessions: set[str]) -> list[str]:
        live = {e.session for e in self._entries.values()} | self._claimed
        return sorted(sessions - live)

    def _add(self, response_id: str, entry: _Entry) -> None:
        old = self._entries.pop(response_id, None)
        if old is not None:  # the same id again: its old size goes
            self._forget(old)
        self._entries[response_id] = entry
        self._bytes += entry.size
        self._held_by_key[entry.tenant] += 1
        self._bytes_by_key[entry.tenant] += entry.size

    def _forget(self, entry: _Entry) -> None:
        self._bytes -= entry.size
        self._held_by_key[entry.tenant] -= 1
        self._bytes_by_key[entry.tenant] -= entry.size
        if self._held_by_key[entry.tenant] <= 0:
            del self._held_by_key[entry.tenant], self._bytes_by_key[entry.tenant]

    def _remove(self, response_id: str) -> None:
        entry = self._entries.pop(response_id)
        self._forget(entry)
        if self.directory is None:
            del self._memory[response_id]
        else:
            self._path(response_id).unlink(missing_ok=True)

    def _path(self, response_id: str) -> Path:
        assert self.directory is not None and _ID.fullmatch(response_id)
        return self.directory / f"{response_id}.json"

    def _read(self, response_id: str) -> bytes:
        return self._memory[response_id] if self.directory is None else self._path(response_id).read_bytes()

    def _write(self, response_id: str, raw: bytes) -> None:
        if self.directory is None:
            self._memory[response_id] = raw
            return
        path = self._path(response_id)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _load(self) -> None:
        """Read the directory: every record's index entry, in the LRU order of the files' mtimes."""
        assert self.directory is not None
        found: list[tuple[int, str, _Entry]] = []
        for path in self.directory.iterdir():
            if path.suffix == ".tmp":
                path.unlink(missing_ok=True)  # a write that did not finish
                continue
            if path.suffix != ".json" or _ID.fullmatch(path.stem) is None:
                continue
            try:
                raw = path.read_bytes()
                rec = _decoder.decode(raw)
                if rec.id != path.stem:
                    raise ValueError(f"the file holds response {rec.id!r}")
            except (OSError, ValueError) as e:  # msgspec's errors are ValueErrors
                log.warning("responses.damaged", path=str(path), reason=str(e))
                path.unlink(missing_ok=True)
                continue
            found.append((path.stat().st_mtime_ns, rec.id, _Entry(rec.tenant, rec.session, rec.upto, len(raw))))
        for _mtime, rid, entry in sorted(found, key=lambda t: (t[0], t[1])):
            self._add(rid, entry)
        while self._entries and (len(self._entries) > self.max_responses or self._bytes > self.max_bytes):
            victim, entry = next(iter(self._entries.items()))  # the limits were lowered since: the oldest go
            self._remove(victim)
            self.evictions += 1
            self._evictions_by_key[entry.tenant] += 1
            log.info("responses.evicted", response_id=victim, at="load")
        log.info("responses.loaded", responses=len(self._entries), bytes=self._bytes)
