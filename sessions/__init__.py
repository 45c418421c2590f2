"""What a conversation is: messages, sampling settings, sessions, the stores that keep them and the
history operations on them. Knows nothing of llama.cpp.
"""

from runtime.errors import (
    InvalidHistoryOp,
    InvalidSampling,
    InvalidSession,
    InvalidSessionId,
    RevisionConflict,
    SessionCorrupt,
    SessionExists,
    SessionNotFound,
    StoreConfigError,
    StoreUnavailable,
    TurnstileError,
)
from sessions import history
from sessions.disk import DiskStore
from sessions.model import Message, Role, Sampling, Session, check_session_id
from sessions.store import MemoryStore, SessionStore

__all__ = [
    "DiskStore",
    "InvalidHistoryOp",
    "InvalidSampling",
    "InvalidSession",
    "InvalidSessionId",
    "MemoryStore",
    "Message",
    "RevisionConflict",
    "Role",
    "Sampling",
    "Session",
    "SessionCorrupt",
    "SessionExists",
    "SessionNotFound",
    "SessionStore",
    "StoreConfigError",
    "StoreUnavailable",
    "TurnstileError",
    "check_session_id",
    "history",
]
