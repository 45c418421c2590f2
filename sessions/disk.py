"""`DiskStore`: sessions in a diskcache directory, shared by threads and processes.

Each record is a checksummed session record (`sessions.record`), stored raw in SQLite through
`RawDisk`, which refuses to unpickle anything: a pickled row (planted or damaged) reads as
`SessionCorrupt` for its id, a pickled key is skipped by `list()` with a warning. Records stay
inside the database, never in side files, so every write is one SQLite transaction: a process
killed mid-write leaves the old record or the new one. Eviction is off: a store never drops a
session on its own. A directory or database that cannot be used (missing rights, read-only, not a
database, damaged) raises `StoreUnavailable` at open or at the operation that finds out, with the
transaction rolled back; no sqlite3 error escapes.

`count()` is diskcache's row count (kept by SQLite triggers in every write transaction, so it is the
directory's, shared by every process), read at open and again inside each transaction that writes: it
includes other processes' writes as of this store's last write, and costs nothing to read.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import diskcache

from runtime.errors import InvalidSessionId, MissingValueFile, StoreUnavailable, UnsafeRecord
from runtime.log import get_logger
from sessions.base import LockedStore
from sessions.model import Session, check_session_id
from sessions.raw_disk import SQLITE_SETTINGS, RawDisk
from sessions.record import encode_record

log = get_logger(__name__)

# diskcache writes bytes values at least this long to side files; keep every record in SQLite.
_IN_DATABASE = 1 << 30
# What a store's own I/O can raise; each becomes StoreUnavailable.
_STORE_ERRORS = (sqlite3.Error, OSError, diskcache.Timeout)


class DiskStore(LockedStore):
    """A `SessionStore` in `directory` (created if missing); several may open the same directory."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(clock=clock)
        self.directory = os.fspath(directory)
        with self._guard():
            self._cache = diskcache.Cache(
                self.directory,
                timeout=timeout,
                disk=RawDisk,
                eviction_policy="none",
                disk_min_file_size=_IN_DATABASE,
                statistics=False,
                tag_index=False,
                **SQLITE_SETTINGS,
            )
            self._count = len(self._cache)
        # diskcache keeps one transaction id per Cache object, so threads of one process take turns
        # here; SQLite's write lock (BEGIN IMMEDIATE) orders them against other processes.
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the database connections; the store reopens them if used again."""
        with self._guard():
            self._cache.close()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn the storage's own errors into `StoreUnavailable` naming the directory."""
        try:
            yield
        except _STORE_ERRORS as err:
            if isinstance(err.__context__, StoreUnavailable):  # e.g. the rollback after a failed write failed too
                raise err.__context__  # noqa: B904 - the first failure, with its own cause
            reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            log.error("store.unavailable", directory=self.directory, reason=reason)
            raise StoreUnavailable(self.directory, reason) from err

    def _read(self, id: str) -> Session | None:
        try:
            with self._guard():
                data = self._cache.get(id, default=None, retry=True)
        except UnsafeRecord as err:
            raise self._corrupt(id, f"record is stored as a pickle, which is never loaded ({err})") from None
        except MissingValueFile as err:  # the row is there, its value file is not: never a silent miss
            raise self._corrupt(id, f"the record's value file is missing or unreadable ({err.reason})") from None
        return self._decode(id, data)

    def _place(self) -> dict[str, str]:
        return {"directory": self.directory}

    def _write(self, session: Session) -> None:
        with self._guard():
            self._cache.set(session.id, encode_record(session), retry=True)

    def _remove(self, id: str) -> bool:
        with self._guard():
            return bool(self._cache.delete(id, retry=True))

    def _contains(self, id: str) -> bool:
        with self._guard():
            return id in self._cache

    def _ids(self) -> builtins.list[str]:
        # Read the key column directly: diskcache's iterkeys would stop at (or unpickle) a pickled key.
        with self._guard():
            rows = self._cache._sql("SELECT rowid, key, raw FROM Cache ORDER BY rowid").fetchall()
        ids = []
        for rowid, key, raw in rows:
            if raw and type(key) is str and _is_session_id(key):
                ids.append(key)
            else:
                what = "a pickled key" if not raw else f"a {type(key).__name__} key that is not a session id"
                log.warning("store.bad_key", directory=self.directory, rowid=rowid, reason=f"{what}; skipped")
        return ids

    def _recount(self) -> int:
        with self._guard():
            return len(self._cache)  # one indexed read of diskcache's Settings row

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        with self._lock, self._guard(), self._cache.transact(retry=True):
            yield


def _is_session_id(key: str) -> bool:
    try:
        check_session_id(key)
    except InvalidSessionId:
        return False
    return True
