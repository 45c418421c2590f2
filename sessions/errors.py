"""The project's base error and the errors about sessions.

`TurnstileError` lives here because `sessions` is the lowest package that raises errors a user catches;
`runtime.errors` re-exports it and adds the runtime's own.
"""

from __future__ import annotations


class TurnstileError(Exception):
    """Base of every error turnstile raises on purpose."""


class InvalidConfig(TurnstileError, ValueError):
    """Raised when a configuration value (a limit, a policy, an engine option, a log level) is not valid."""


def _show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SessionNotFound(TurnstileError):
    """Raised when an operation names a session id the store does not hold."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {_show(session_id)} not found")
        self.session_id = session_id


class SessionExists(TurnstileError):
    """Raised when creating, forking or importing onto an id the store already holds."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {_show(session_id)} already exists")
        self.session_id = session_id


class InvalidSessionId(TurnstileError):
    """Raised when a session id is not 1 to 128 characters of `[A-Za-z0-9._:@-]`."""

    def __init__(self, session_id: object) -> None:
        super().__init__(f"invalid session id {_show(session_id)}: want 1 to 128 characters of [A-Za-z0-9._:@-]")
        self.session_id = session_id


class RevisionConflict(TurnstileError):
    """Raised when a write expected a revision other than the one stored (another writer came first)."""

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(f"session {_show(session_id)}: expected revision {expected}, stored is {actual}")
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class InvalidSampling(TurnstileError):
    """Raised when a sampling setting has the wrong type, is out of range, or is not a setting at all."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"invalid sampling {field}={_show(value)}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


class InvalidSession(TurnstileError):
    """Raised when a message, session value, metadata or imported document breaks the session rules."""


class InvalidHistoryOp(TurnstileError):
    """Raised when a history operation's index or count does not fit the session's messages."""


class SessionCorrupt(TurnstileError):
    """Raised when a stored session record cannot be decoded into a valid session."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {_show(session_id)} is corrupt: {reason}")
        self.session_id = session_id
        self.reason = reason


class UnsafeRecord(TurnstileError):
    """Raised when a stored row would have to be unpickled to be read (or written); it never is."""


class StoreUnavailable(TurnstileError):
    """Raised when a session store cannot be used: unreadable, read-only, damaged, full or unreachable."""

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"session store {location} is unavailable: {reason}")
        self.location = location
        self.reason = reason


class StoreConfigError(TurnstileError, ValueError):
    """Raised when a store is given a bad option (a URL it cannot parse, a key prefix that is not a str)."""
