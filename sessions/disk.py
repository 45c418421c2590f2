"""`DiskStore`: sessions in a diskcache directory, shared by threads and processes.

Each record is the session's msgpack bytes, stored raw in SQLite (diskcache's raw mode for `bytes`;
nothing is pickled). Records stay inside the database, never in side files, so every write is one
SQLite transaction: a process killed mid-write leaves the old record or the new one. Eviction is off:
a store never drops a session on its own.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import diskcache
import msgspec

from sessions.base import StoreBase
from sessions.errors import SessionCorrupt, TurnstileError
from sessions.log import get_logger
from sessions.model import Session

log = get_logger(__name__)

# diskcache writes bytes values at least this long to side files; keep every record in SQLite.
_IN_DATABASE = 1 << 30


class DiskStore(StoreBase):
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
        self._cache = diskcache.Cache(
            self.directory,
            timeout=timeout,
            eviction_policy="none",
            disk_min_file_size=_IN_DATABASE,
            statistics=False,
            tag_index=False,
        )
        # diskcache keeps one transaction id per Cache object, so threads of one process take turns
        # here; SQLite's write lock (BEGIN IMMEDIATE) orders them against other processes.
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the database connections; the store reopens them if used again."""
        self._cache.close()

    def _read(self, id: str) -> Session | None:
        data = self._cache.get(id, default=None, retry=True)
        if data is None:
            return None
        if not isinstance(data, bytes):
            raise self._corrupt(id, f"record is a {type(data).__name__}, not msgpack bytes")
        try:
            session = msgspec.msgpack.decode(data, type=Session)
        except (msgspec.DecodeError, TurnstileError) as err:
            raise self._corrupt(id, str(err)) from None
        if session.id != id:
            raise self._corrupt(id, f"record holds session {session.id!r}")
        return session

    def _corrupt(self, id: str, reason: str) -> SessionCorrupt:
        log.warning("session.corrupt", session_id=id, reason=reason, directory=self.directory)
        return SessionCorrupt(id, reason)

    def _write(self, session: Session) -> None:
        self._cache.set(session.id, msgspec.msgpack.encode(session), retry=True)

    def _remove(self, id: str) -> bool:
        return bool(self._cache.delete(id, retry=True))

    def _contains(self, id: str) -> bool:
        return id in self._cache

    def _ids(self) -> builtins.list[str]:
        return [key for key in self._cache.iterkeys() if isinstance(key, str)]

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        with self._lock, self._cache.transact(retry=True):
            yield
