"""The `SessionStore` protocol and `MemoryStore`, the store that lives in one process's memory.

Every method is synchronous; a caller on an event loop runs them in a worker thread. Each mutating
method is atomic: two writers never interleave on one session.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, Unpack, runtime_checkable

import msgspec

from sessions.base import LockedStore
from sessions.model import NewSession, Session


@runtime_checkable
class SessionStore(Protocol):
    """Where sessions are kept; `MemoryStore`, `DiskStore` and `RedisStore` implement it."""

    def create(self, id: str, **fields: Unpack[NewSession]) -> Session: ...

    def get(self, id: str) -> Session: ...

    def exists(self, id: str) -> bool: ...

    def list(self) -> builtins.list[str]: ...

    def count(self) -> int:
        """How many sessions the store holds, kept in memory: no I/O and no wait, so an event loop may ask
        at any time (`Runtime.stats()`, `/metrics`). Exact for this store's own writes; with several
        processes on one directory or server, what the shared count was at this store's last write."""
        ...

    def delete(self, id: str) -> None: ...

    def put(self, session: Session, *, expected_revision: int) -> Session: ...

    def append_turn(self, id: str, user: str, assistant: str, *, expected_revision: int | None = None) -> Session: ...

    def append_reply(self, id: str, assistant: str, *, expected_revision: int | None = None) -> Session: ...

    def commit(
        self, session: Session, *, expected_revision: int | None, unless: Callable[[], bool] = ...
    ) -> Session | None: ...

    def revert(self, session_id: str, previous: Session | None, *, expected_revision: int) -> bool: ...

    def fork(self, src: str, new_id: str, upto: int | None = None) -> Session: ...

    def undo(self, id: str, n: int = 1, *, expected_revision: int | None = None) -> Session: ...

    def edit(self, id: str, index: int, content: str, *, expected_revision: int | None = None) -> Session: ...

    def truncate(self, id: str, n_messages: int, *, expected_revision: int | None = None) -> Session: ...

    def export(self, id: str) -> str: ...

    def import_(self, json_str: str | bytes, *, new_id: str | None = None, overwrite: bool = False) -> Session: ...

    def close(self) -> None: ...


class MemoryStore(LockedStore):
    """Sessions in a dict guarded by a lock, kept as msgpack bytes so no caller shares a value with it.

    `count()` is the dict's length (always exact)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock=clock)
        self._records: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _read(self, id: str) -> Session | None:
        data = self._records.get(id)
        return None if data is None else msgspec.msgpack.decode(data, type=Session)

    def _write(self, session: Session) -> None:
        self._records[session.id] = msgspec.msgpack.encode(session)

    def _remove(self, id: str) -> bool:
        return self._records.pop(id, None) is not None

    def _contains(self, id: str) -> bool:
        return id in self._records

    def _ids(self) -> builtins.list[str]:
        with self._lock:
            return builtins.list(self._records)

    def _recount(self) -> int:
        return len(self._records)

    def count(self) -> int:
        return len(self._records)

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        with self._lock:
            yield

    def close(self) -> None:
        """Nothing to release; the sessions stay in memory until the store is dropped."""
