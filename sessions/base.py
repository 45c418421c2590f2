"""`StoreBase`: every store operation, written once over a few storage primitives.

A concrete store provides `_read`, `_contains` and `_ids` (plain reads) and `_transact(fn)`, which runs
`fn` with a `Records` view so that its reads and writes take effect together or not at all, never
interleaved with another writer's: `LockedStore` does that by holding a lock (memory and disk stores),
the Redis store by WATCH/MULTI, re-running `fn` when another writer came first (so `fn` must not have
side effects beyond the view). Everything else, including the revision check and the history
operations, lives here so every store behaves alike.

`count()` is the one figure read on the event loop (`Runtime.stats()`, `/metrics`): each store keeps it in
memory as its transactions go, so reading it does no I/O and waits for no lock; `list()` is the scan.
"""

from __future__ import annotations

import builtins
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Protocol, Self, TypeVar, Unpack

import msgspec

from runtime.errors import (
    InvalidSession,
    RevisionConflict,
    SessionCorrupt,
    SessionExists,
    SessionNotFound,
)
from runtime.log import get_logger
from sessions import history
from sessions.model import NewSession, Session, check_session_id, validate
from sessions.record import decode_record

log = get_logger(__name__)

T = TypeVar("T")


class Records(Protocol):
    """The records a transaction sees; its writes take effect when the transaction ends."""

    def read(self, id: str) -> Session | None:
        """The stored session, or None; `SessionCorrupt` for a record that does not decode."""

    def contains(self, id: str) -> bool:
        """Whether a record exists, without decoding it."""

    def write(self, session: Session) -> None:
        """Store `session` under its id, replacing any record."""

    def remove(self, id: str) -> bool:
        """Remove the record; False if there was none."""


class StoreBase(ABC):
    """The shared implementation of the `SessionStore` protocol."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    # --- storage primitives -----------------------------------------------------------------------

    @abstractmethod
    def _read(self, id: str) -> Session | None:
        """The stored session, or None; raises `SessionCorrupt` for a record that does not decode."""

    @abstractmethod
    def _contains(self, id: str) -> bool:
        """Whether a record exists, without decoding it."""

    @abstractmethod
    def _ids(self) -> Iterable[str]:
        """Every stored id, in any order."""

    @abstractmethod
    def _transact(self, fn: Callable[[Records], T]) -> T:
        """Run `fn` on the records as one atomic read-modify-write and return its result."""

    @abstractmethod
    def close(self) -> None:
        """Release the store's resources."""

    @abstractmethod
    def count(self) -> int:
        """How many sessions the store holds, kept in memory: no I/O, no wait (each store says how current)."""

    def _place(self) -> dict[str, str]:
        """Where the store keeps its records, as log fields (`directory=...`, `location=...`)."""
        return {}

    def _decode(self, id: str, data: object) -> Session | None:
        """A stored record's session (None for no record); a record that does not decode is `SessionCorrupt`."""
        if data is None:
            return None
        try:
            return decode_record(id, data)
        except SessionCorrupt as err:
            raise self._corrupt(id, err.reason) from None

    def _corrupt(self, id: str, reason: str) -> SessionCorrupt:
        log.warning("session.corrupt", session_id=id, reason=reason, **self._place())
        return SessionCorrupt(id, reason)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- basic operations -------------------------------------------------------------------------

    def create(self, id: str, **fields: Unpack[NewSession]) -> Session:
        """Create a session at revision 0; `SessionExists` if the id is taken."""
        session = Session.new(id, now=self._clock(), **fields)

        def txn(records: Records) -> None:
            if records.contains(id):
                raise SessionExists(id)
            records.write(session)

        self._transact(txn)
        log.info("session.created", session_id=id)
        return session

    def get(self, id: str) -> Session:
        """The stored session; `SessionNotFound` if there is none."""
        check_session_id(id)
        session = self._read(id)
        if session is None:
            raise SessionNotFound(id)
        return session

    def exists(self, id: str) -> bool:
        """Whether the store holds a session with this id."""
        return self._contains(check_session_id(id))

    def list(self) -> builtins.list[str]:
        """Every session id, sorted."""
        return sorted(self._ids())

    def delete(self, id: str) -> None:
        """Remove a session; `SessionNotFound` if there is none."""
        check_session_id(id)

        def txn(records: Records) -> None:
            if not records.remove(id):
                raise SessionNotFound(id)

        self._transact(txn)
        log.info("session.deleted", session_id=id)

    def put(self, session: Session, *, expected_revision: int) -> Session:
        """Replace the stored session if its revision is `expected_revision` (else `RevisionConflict`)."""
        validate(session)
        return self._update(session.id, lambda _current, _now: session, expected_revision)

    def append_turn(self, id: str, user: str, assistant: str, *, expected_revision: int | None = None) -> Session:
        """Commit a user message and its reply together, optionally checking the revision first."""
        return self._update(id, lambda s, now: history.append_turn(s, user, assistant, now=now), expected_revision)

    def append_reply(self, id: str, assistant: str, *, expected_revision: int | None = None) -> Session:
        """Commit the reply to a trailing unanswered user message (what `edit` leaves)."""
        return self._update(id, lambda s, now: history.append_reply(s, assistant, now=now), expected_revision)

    # --- history operations -----------------------------------------------------------------------

    def fork(self, src: str, new_id: str, upto: int | None = None) -> Session:
        """Copy `src` under `new_id` with its first `upto` messages (all if None), at revision 0."""
        check_session_id(src)
        check_session_id(new_id)

        def txn(records: Records) -> Session:
            source = records.read(src)
            if source is None:
                raise SessionNotFound(src)
            if records.contains(new_id):
                raise SessionExists(new_id)
            session = history.fork(source, new_id, upto, now=self._clock())
            records.write(session)
            return session

        session = self._transact(txn)
        log.info("session.forked", session_id=new_id, source=src, messages=len(session.messages))
        return session

    def undo(self, id: str, n: int = 1, *, expected_revision: int | None = None) -> Session:
        """Drop the last `n` user/assistant exchanges."""
        session = self._update(id, lambda s, _now: history.undo(s, n), expected_revision)
        log.info("session.undone", session_id=id, exchanges=n)
        return session

    def edit(self, id: str, index: int, content: str, *, expected_revision: int | None = None) -> Session:
        """Replace the user message at `index` and drop what followed; the caller regenerates the reply."""
        session = self._update(id, lambda s, now: history.edit(s, index, content, now=now), expected_revision)
        log.info("session.edited", session_id=id, index=index)
        return session

    def truncate(self, id: str, n_messages: int, *, expected_revision: int | None = None) -> Session:
        """Keep the first `n_messages` messages."""
        session = self._update(id, lambda s, _now: history.truncate(s, n_messages), expected_revision)
        log.info("session.truncated", session_id=id, messages=n_messages)
        return session

    def export(self, id: str) -> str:
        """The session as JSON in the OpenAI messages shape plus turnstile's fields."""
        return history.export(self.get(id))

    def import_(self, json_str: str | bytes, *, new_id: str | None = None, overwrite: bool = False) -> Session:
        """Store an exported document as is (renamed to `new_id` if given).

        Onto an existing id only with `overwrite`; the revision then becomes at least the replaced
        one's plus 1, so a writer holding the old revision gets `RevisionConflict`.
        """
        imported = history.import_(json_str, new_id=new_id, now=self._clock())

        def txn(records: Records) -> Session:
            session = imported
            if records.contains(session.id):
                if not overwrite:
                    raise SessionExists(session.id)
                try:
                    current = records.read(session.id)
                except SessionCorrupt:
                    current = None
                if current is not None and session.revision <= current.revision:
                    session = msgspec.structs.replace(session, revision=current.revision + 1)
            records.write(session)
            return session

        session = self._transact(txn)
        log.info("session.imported", session_id=session.id, messages=len(session.messages))
        return session

    # --- the one read-modify-write ------------------------------------------------------------------

    def _update(self, id: str, change: Callable[[Session, float], Session], expected_revision: int | None) -> Session:
        check_session_id(id)
        if expected_revision is not None and (
            not isinstance(expected_revision, int) or isinstance(expected_revision, bool)
        ):
            raise InvalidSession(f"expected_revision must be an int or None, not {expected_revision!r}")

        def txn(records: Records) -> Session:
            current = records.read(id)
            if current is None:
                raise SessionNotFound(id)
            if expected_revision is not None and current.revision != expected_revision:
                log.debug("session.conflict", session_id=id, expected=expected_revision, actual=current.revision)
                raise RevisionConflict(id, expected_revision, current.revision)
            now = self._clock()
            changed = change(current, now)
            session = validate(msgspec.structs.replace(changed, revision=current.revision + 1, updated=now))
            records.write(session)
            return session

        return self._transact(txn)

    # --- a turn's commit, and its undo ----------------------------------------------------------------

    def commit(
        self, session: Session, *, expected_revision: int | None, unless: Callable[[], bool] = lambda: False
    ) -> Session | None:
        """Store a turn's result as the next revision of the session it was computed from.

        `expected_revision` is that session's stored revision (None: no session may exist yet; the turn
        creates it, at revision 1). `unless()` is asked inside the store's transaction right before the
        write: if it is true nothing is written and None is returned, so a caller that withdrew first never
        finds its turn committed.
        """
        validate(session)

        def txn(records: Records) -> Session | None:
            current = records.read(session.id)
            if current is None and expected_revision is not None:
                raise SessionNotFound(session.id)
            if current is not None and expected_revision is None:
                raise SessionExists(session.id)
            if current is not None and expected_revision is not None and current.revision != expected_revision:
                raise RevisionConflict(session.id, expected_revision, current.revision)
            if unless():
                return None
            stored = msgspec.structs.replace(session, revision=(expected_revision or 0) + 1, updated=self._clock())
            records.write(stored)
            return stored

        return self._transact(txn)

    def revert(self, session_id: str, previous: Session | None, *, expected_revision: int) -> bool:
        """Undo a `commit` whose caller went away: put `previous` back exactly (remove the session if None)
        if the stored revision is still `expected_revision`; False, nothing changed, if another write came."""

        def txn(records: Records) -> bool:
            current = records.read(session_id)
            if current is None or current.revision != expected_revision:
                return False
            if previous is None:
                records.remove(session_id)
            else:
                records.write(previous)
            return True

        done = self._transact(txn)
        if done:
            log.info("session.reverted", session_id=session_id, revision=expected_revision)
        return done


class LockedStore(StoreBase):
    """A store whose transactions hold a lock (`_atomic`) over direct reads and writes.

    `count()` is the figure `_recount()` gave at the end of the last transaction that wrote (and at open).
    """

    _count = 0

    @abstractmethod
    def _write(self, session: Session) -> None:
        """Store `session` under its id, replacing any record."""

    @abstractmethod
    def _remove(self, id: str) -> bool:
        """Remove the record; False if there was none."""

    @abstractmethod
    def _atomic(self) -> AbstractContextManager[None]:
        """Hold off every other writer (threads and processes) for a read-modify-write."""

    @abstractmethod
    def _recount(self) -> int:
        """How many sessions the store holds now (in a transaction: with its writes)."""

    def count(self) -> int:
        return self._count

    def _transact(self, fn: Callable[[Records], T]) -> T:
        mine = None
        try:
            with self._atomic():
                before = self._count
                view = _Direct(self)
                result = fn(view)
                if view.changed:  # set under the lock, so writers set it in the order they commit
                    self._count = mine = self._recount()
        except BaseException:
            if mine is not None and self._count == mine:  # the commit failed: nothing changed
                self._count = before
            raise
        return result


class _Direct:
    """`Records` straight on a `LockedStore`'s primitives (its lock is held)."""

    def __init__(self, store: LockedStore) -> None:
        self._store = store
        self.changed = False

    def read(self, id: str) -> Session | None:
        return self._store._read(id)

    def contains(self, id: str) -> bool:
        return self._store._contains(id)

    def write(self, session: Session) -> None:
        self.changed = True
        self._store._write(session)

    def remove(self, id: str) -> bool:
        removed = self._store._remove(id)
        self.changed = self.changed or removed
        return removed
