"""History operations as pure functions of `Session` values: each returns a new session.

They never touch `revision` or `updated`: stamping a write is the store's business. `now` sets the time
of messages they create (default: the current time).

The export format is a JSON object in the OpenAI messages shape plus turnstile's own fields::

    {"format": "turnstile.session/1", "id": "...",
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "...", "created": 1700000000.0}, ...],
     "sampling": {...}, "metadata": {...}, "created": ..., "updated": ..., "revision": 3}

`import_` also takes a bare OpenAI messages list, or an object with only `messages`; missing times
default to `now`, missing sampling to the defaults.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import msgspec

from sessions.errors import InvalidHistoryOp, InvalidSession, InvalidSessionId
from sessions.model import Message, Sampling, Session, check_session_id

FORMAT = "turnstile.session/1"


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def _count(value: object, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidHistoryOp(f"{name}={value!r} is not an int in [{low}, {high}]")
    return value


def fork(session: Session, new_id: str, upto: int | None = None, *, now: float | None = None) -> Session:
    """A copy of `session` under `new_id` with its first `upto` messages (all if None), at revision 0."""
    check_session_id(new_id)
    n = len(session.messages) if upto is None else _count(upto, "upto", 0, len(session.messages))
    stamp = _now(now)
    return msgspec.structs.replace(
        session,
        id=new_id,
        messages=session.messages[:n],
        metadata=copy.deepcopy(session.metadata),
        created=stamp,
        updated=stamp,
        revision=0,
    )


def undo(session: Session, n: int = 1) -> Session:
    """Drop the last `n` exchanges; an exchange is a user message and everything after it up to the next."""
    users = [i for i, m in enumerate(session.messages) if m.role == "user"]
    _count(n, "n", 1, len(users))
    return msgspec.structs.replace(session, messages=session.messages[: users[-n]])


def edit(session: Session, index: int, content: str, *, now: float | None = None) -> Session:
    """Replace the user message at `index` (negative counts from the end) and drop everything after it."""
    size = len(session.messages)
    if size == 0:
        raise InvalidHistoryOp("edit: the session has no messages")
    i = _count(index, "index", -size, size - 1) % size
    if session.messages[i].role != "user":
        raise InvalidHistoryOp(f"messages[{i}] is a {session.messages[i].role} message, not a user message")
    _check_text(content, "content")
    return msgspec.structs.replace(session, messages=(*session.messages[:i], Message("user", content, _now(now))))


def truncate(session: Session, n_messages: int) -> Session:
    """Keep the first `n_messages` messages."""
    _count(n_messages, "n_messages", 0, len(session.messages))
    return msgspec.structs.replace(session, messages=session.messages[:n_messages])


def append_turn(session: Session, user: str, assistant: str, *, now: float | None = None) -> Session:
    """Add a user message and its reply."""
    _check_text(user, "user")
    _check_text(assistant, "assistant")
    stamp = _now(now)
    turn = (Message("user", user, stamp), Message("assistant", assistant, stamp))
    return msgspec.structs.replace(session, messages=session.messages + turn)


def append_user(session: Session, user: str, *, now: float | None = None) -> Session:
    """Add a user message (the prompt of a turn whose reply is not there yet)."""
    _check_text(user, "user")
    return msgspec.structs.replace(session, messages=(*session.messages, Message("user", user, _now(now))))


def append_reply(session: Session, assistant: str, *, now: float | None = None) -> Session:
    """Add the reply to a session whose last message is an unanswered user message (after `edit`)."""
    if not session.messages or session.messages[-1].role != "user":
        raise InvalidHistoryOp("append_reply needs a session whose last message is a user message")
    _check_text(assistant, "assistant")
    return msgspec.structs.replace(session, messages=(*session.messages, Message("assistant", assistant, _now(now))))


def _check_text(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise InvalidSession(f"{name} must be a str, not {type(value).__name__}")


# --- export / import -------------------------------------------------------------------------------


class _WireMessage(msgspec.Struct):
    role: str
    content: str
    created: float | None = None


class _Document(msgspec.Struct):
    messages: list[_WireMessage]
    format: str = FORMAT
    id: str | None = None
    sampling: dict[str, Any] | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    created: float | None = None
    updated: float | None = None
    revision: int = 0
    context: str | None = None


def export(session: Session) -> str:
    """The session as a JSON document (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    if session.system is not None:
        messages.append({"role": "system", "content": session.system})
    messages.extend({"role": m.role, "content": m.content, "created": m.created} for m in session.messages)
    document = {
        "format": FORMAT,
        "id": session.id,
        "messages": messages,
        "sampling": msgspec.structs.asdict(session.sampling),
        "metadata": session.metadata,
        "created": session.created,
        "updated": session.updated,
        "revision": session.revision,
    }
    if session.context is not None:
        document["context"] = session.context
    return msgspec.json.encode(document).decode()


def import_(data: str | bytes, *, new_id: str | None = None, now: float | None = None) -> Session:
    """Parse an exported document (or a bare OpenAI messages list) into a session; `new_id` renames it."""
    if new_id is not None:
        check_session_id(new_id)
    try:
        parsed = msgspec.json.decode(data, type=_Document | list[_WireMessage])
    except msgspec.DecodeError as err:  # ValidationError is a DecodeError
        raise InvalidSession(f"not a session document: {err}") from None
    doc = _Document(messages=parsed) if isinstance(parsed, list) else parsed
    if doc.format != FORMAT:
        raise InvalidSession(f"unknown format {doc.format!r}; this version reads {FORMAT!r}")
    session_id = new_id if new_id is not None else doc.id
    if session_id is None:
        raise InvalidSessionId(None)
    stamp = _now(now)
    wire = doc.messages
    system = None
    if wire and wire[0].role == "system":
        system, wire = wire[0].content, wire[1:]
    messages = []
    for i, m in enumerate(wire):
        if m.role not in ("user", "assistant"):
            raise InvalidSession(f"message {i}: role {m.role!r}; only the first message may be system")
        created = stamp if m.created is None else m.created
        messages.append(Message("user" if m.role == "user" else "assistant", m.content, created))
    sampling = Sampling() if doc.sampling is None else Sampling.from_mapping(doc.sampling)
    created = stamp if doc.created is None else doc.created
    return Session(
        id=session_id,
        system=system,
        messages=tuple(messages),
        sampling=sampling,
        metadata=doc.metadata,
        created=created,
        updated=created if doc.updated is None else doc.updated,
        revision=doc.revision,
        context=doc.context,  # type: ignore[arg-type]  # checked by Session
    )
