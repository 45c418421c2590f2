"""`StoreBase`: every store operation, written once over five storage primitives.

A concrete store provides `_read`, `_write`, `_remove`, `_contains`, `_ids` and `_atomic` (a context
manager under which a read-modify-write cannot interleave with another writer). Everything else,
including the revision check and the history operations, lives here so both stores behave alike.
"""

from __future__ import annotations

import builtins
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Self

import msgspec

from sessions import history
from sessions.errors import (
    InvalidSession,
    RevisionConflict,
    SessionCorrupt,
    SessionExists,
    SessionNotFound,
)
from sessions.log import get_logger
from sessions.model import Sampling, Session, check_session_id, validate

log = get_logger(__name__)


class StoreBase(ABC):
    """The shared implementation of the `SessionStore` protocol."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    # --- storage primitives -----------------------------------------------------------------------

    @abstractmethod
    def _read(self, id: str) -> Session | None:
        """The stored session, or None; raises `SessionCorrupt` for a record that does not decode."""

    @abstractmethod
    def _write(self, session: Session) -> None:
        """Store `session` under its id, replacing any record."""

    @abstractmethod
    def _remove(self, id: str) -> bool:
        """Remove the record; False if there was none."""

    @abstractmethod
    def _contains(self, id: str) -> bool:
        """Whether a record exists, without decoding it."""

    @abstractmethod
    def _ids(self) -> Iterable[str]:
        """Every stored id, in any order."""

    @abstractmethod
    def _atomic(self) -> AbstractContextManager[None]:
        """Hold off every other writer (threads and processes) for a read-modify-write."""

    @abstractmethod
    def close(self) -> None:
        """Release the store's resources."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- basic operations -------------------------------------------------------------------------

    def create(
        self,
        id: str,
        *,
        system: str | None = None,
        sampling: Sampling | Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Session:
        """Create a session at revision 0; `SessionExists` if the id is taken."""
        session = Session.new(id, system=system, sampling=sampling, metadata=metadata, now=self._clock())
        with self._atomic():
            if self._contains(id):
                raise SessionExists(id)
            self._write(session)
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
        with self._atomic():
            if not self._remove(id):
                raise SessionNotFound(id)
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
        with self._atomic():
            source = self._read(src)
            if source is None:
                raise SessionNotFound(src)
            if self._contains(new_id):
                raise SessionExists(new_id)
            session = history.fork(source, new_id, upto, now=self._clock())
            self._write(session)
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
        session = history.import_(json_str, new_id=new_id, now=self._clock())
        with self._atomic():
            if self._contains(session.id):
                if not overwrite:
                    raise SessionExists(session.id)
                try:
                    current = self._read(session.id)
                except SessionCorrupt:
                    current = None
                if current is not None and session.revision <= current.revision:
                    session = msgspec.structs.replace(session, revision=current.revision + 1)
            self._write(session)
        log.info("session.imported", session_id=session.id, messages=len(session.messages))
        return session

    # --- the one read-modify-write ------------------------------------------------------------------

    def _update(self, id: str, change: Callable[[Session, float], Session], expected_revision: int | None) -> Session:
        check_session_id(id)
        if expected_revision is not None and (
            not isinstance(expected_revision, int) or isinstance(expected_revision, bool)
        ):
            raise InvalidSession(f"expected_revision must be an int or None, not {expected_revision!r}")
        with self._atomic():
            current = self._read(id)
            if current is None:
                raise SessionNotFound(id)
            if expected_revision is not None and current.revision != expected_revision:
                log.debug("session.conflict", session_id=id, expected=expected_revision, actual=current.revision)
                raise RevisionConflict(id, expected_revision, current.revision)
            now = self._clock()
            changed = change(current, now)
            session = validate(msgspec.structs.replace(changed, revision=current.revision + 1, updated=now))
            self._write(session)
        return session

    # --- a turn's commit, and its undo ----------------------------------------------------------------

    def commit(
        self, session: Session, *, expected_revision: int | None, unless: Callable[[], bool] = lambda: False
    ) -> Session | None:
        """Store a turn's result as the next revision of the session it was computed from.

        `expected_revision` is that session's stored revision (None: no session may exist yet; the turn
        creates it, at revision 1). `unless()` is asked under the store's lock right before the write: if
        it is true nothing is written and None is returned, so a caller that withdrew first never finds
        its turn committed.
        """
        validate(session)
        with self._atomic():
            current = self._read(session.id)
            if current is None and expected_revision is not None:
                raise SessionNotFound(session.id)
            if current is not None and expected_revision is None:
                raise SessionExists(session.id)
            if current is not None and expected_revision is not None and current.revision != expected_revision:
                raise RevisionConflict(session.id, expected_revision, current.revision)
            if unless():
                return None
            revision = (expected_revision or 0) + 1
            stored = msgspec.structs.replace(session, revision=revision, updated=self._clock())
            self._write(stored)
        return stored

    def revert(self, session_id: str, previous: Session | None, *, expected_revision: int) -> bool:
        """Undo a `commit` whose caller went away: put `previous` back exactly (remove the session if None)
        if the stored revision is still `expected_revision`; False, nothing changed, if another write came."""
        with self._atomic():
            current = self._read(session_id)
            if current is None or current.revision != expected_revision:
                return False
            if previous is None:
                self._remove(session_id)
            else:
                self._write(previous)
        log.info("session.reverted", session_id=session_id, revision=expected_revision)
        return True
