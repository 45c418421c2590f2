"""History operations as pure functions of `Session` values: each returns a new session.

They never touch `revision` or `updated`: stamping a write is the store's business. `now` sets the time
of messages they create (default: the current time).

The export format is a JSON object in the OpenAI messages shape plus turnstile's own fields::

    {"format": "turnstile.session/1", "id": "...",
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "...", "created": 1700000000.0}, ...],
     "sampling": {...}, "metadata": {...}, "created": ..., "updated": ..., "revision": 3}

Assistant tool calls and tool messages are exported as OpenAI has them, call arguments as a JSON string::

    {"role": "assistant", "content": "", "created": ..., "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "add", "arguments": "{\"a\":1}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3", "created": ...}

A thinking model's reasoning is an assistant message's `reasoning_content` (llama-server's field), left
out when empty. Messages without tool calls or reasoning keep the shape they always had, so documents
written before those existed still import.

`import_` also takes a bare OpenAI messages list, or an object with only `messages`; missing times
default to `now`, missing sampling to the defaults; arguments may be a JSON string or an object, and an
assistant message with tool calls may have `content: null`.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from runtime.errors import InvalidHistoryOp, InvalidSession, InvalidSessionId
from sessions.model import INHERITED, Message, Sampling, Session, ToolCall, check_session_id
from sessions.sampler_settings import NAMES as SAMPLER_NAMES

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


def append_turn(
    session: Session, user: str, assistant: str, *, tool_calls: Sequence[ToolCall] = (), now: float | None = None
) -> Session:
    """Add a user message and its reply (which may carry tool calls)."""
    _check_text(user, "user")
    _check_text(assistant, "assistant")
    stamp = _now(now)
    turn = (Message("user", user, stamp), Message("assistant", assistant, stamp, tuple(tool_calls)))
    return msgspec.structs.replace(session, messages=session.messages + turn)


def append_user(session: Session, user: str, *, now: float | None = None) -> Session:
    """Add a user message (the prompt of a turn whose reply is not there yet)."""
    _check_text(user, "user")
    return msgspec.structs.replace(session, messages=(*session.messages, Message("user", user, _now(now))))


def append_reply(
    session: Session,
    assistant: str,
    *,
    tool_calls: Sequence[ToolCall] = (),
    now: float | None = None,
    reasoning: str = "",
) -> Session:
    """Add the reply (its answer, calls and reasoning) to a session whose last message is an unanswered user
    message (after `edit`) or a tool result."""
    if not session.messages or session.messages[-1].role not in ("user", "tool"):
        raise InvalidHistoryOp("append_reply needs a session whose last message is a user or tool message")
    _check_text(assistant, "assistant")
    _check_text(reasoning, "reasoning")
    reply = Message("assistant", assistant, _now(now), tuple(tool_calls), reasoning=reasoning)
    return msgspec.structs.replace(session, messages=(*session.messages, reply))


def pending_calls(session: Session) -> tuple[ToolCall, ...]:
    """The calls of the last assistant message that no tool message has answered yet (in call order)."""
    last = None
    for i in range(len(session.messages) - 1, -1, -1):
        if session.messages[i].role == "assistant":
            last = i
            break
    if last is None:
        return ()
    answered = {m.tool_call_id for m in session.messages[last + 1 :] if m.role == "tool"}
    return tuple(c for c in session.messages[last].tool_calls if c.id not in answered)


def append_tool_results(session: Session, results: Mapping[str, str], *, now: float | None = None) -> Session:
    """Add one tool message per `{call_id: content}`, in the order the calls were made.

    Every id must name a call of the last assistant message not yet answered; `InvalidHistoryOp` otherwise.
    """
    if not isinstance(results, Mapping) or not results:
        raise InvalidHistoryOp("tool results must be a non-empty mapping of call id to content")
    open_calls = pending_calls(session)
    known = {c.id for c in open_calls}
    for call_id, content in results.items():
        if call_id not in known:
            raise InvalidHistoryOp(f"tool result for {call_id!r}, which is not an unanswered call of the last reply")
        _check_text(content, f"tool result {call_id}")
    stamp = _now(now)
    added = tuple(Message("tool", results[c.id], stamp, tool_call_id=c.id) for c in open_calls if c.id in results)
    return msgspec.structs.replace(session, messages=session.messages + added)


def regenerate_base(session: Session) -> Session:
    """The session a regenerated reply answers: without its last assistant message, if that is last.

    It then ends with a user message or a tool result; anything else raises `InvalidHistoryOp`.
    """
    msgs = session.messages
    if msgs and msgs[-1].role == "assistant":
        session = msgspec.structs.replace(session, messages=msgs[:-1])
        msgs = session.messages
    if msgs and msgs[-1].role in ("user", "tool"):
        return session
    raise InvalidHistoryOp(f"session {session.id!r} has no turn to regenerate")


def _check_text(value: object, name: str) -> None:
    if not isinstance(value, str):
        raise InvalidSession(f"{name} must be a str, not {type(value).__name__}")


# --- export / import -------------------------------------------------------------------------------


class _WireFunction(msgspec.Struct):
    name: str
    arguments: str | dict[str, Any] = "{}"


class _WireToolCall(msgspec.Struct):
    id: str
    function: _WireFunction
    type: str = "function"


class _WireMessage(msgspec.Struct):
    role: str
    content: str | msgspec.UnsetType | None = msgspec.UNSET
    created: float | None = None
    tool_calls: list[_WireToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


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


def _export_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content, "created": m.created}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": msgspec.json.encode(c.arguments).decode()},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    return out


def _export_sampling(sampling: Sampling) -> dict[str, Any]:
    """The settings, those that inherit the runtime's (None) and the other samplers' at their defaults left out:
    the shape of older documents (a banned token's bias, -inf, is written `false`, as llama-server reads it)."""
    values = msgspec.structs.asdict(sampling)
    out = {k: v for k, v in values.items() if not (k in INHERITED and v is None)}
    for name in SAMPLER_NAMES:
        if out[name] == _DEFAULTS[name]:
            del out[name]
    if "logit_bias" in out:
        out["logit_bias"] = [[t, False if b == -math.inf else b] for t, b in out["logit_bias"]]
    return out


_DEFAULTS = msgspec.structs.asdict(Sampling())


def export(session: Session) -> str:
    """The session as a JSON document (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    if session.system is not None:
        messages.append({"role": "system", "content": session.system})
    messages.extend(_export_message(m) for m in session.messages)
    document = {
        "format": FORMAT,
        "id": session.id,
        "messages": messages,
        "sampling": _export_sampling(session.sampling),
        "metadata": session.metadata,
        "created": session.created,
        "updated": session.updated,
        "revision": session.revision,
    }
    if session.context is not None:
        document["context"] = session.context
    return msgspec.json.encode(document).decode()


def _import_call(i: int, call: _WireToolCall) -> ToolCall:
    if call.type != "function":
        raise InvalidSession(f"message {i}: tool call type {call.type!r} is not 'function'")
    args = call.function.arguments
    if isinstance(args, str):
        try:
            args = msgspec.json.decode(args)
        except msgspec.DecodeError as err:
            raise InvalidSession(f"message {i}: tool call {call.id!r} arguments are not JSON: {err}") from None
        if not isinstance(args, dict):
            raise InvalidSession(f"message {i}: tool call {call.id!r} arguments are not a JSON object")
    return ToolCall(call.id, call.function.name, args)


def _import_message(i: int, m: _WireMessage, stamp: float) -> Message:
    if m.role not in ("user", "assistant", "tool"):
        raise InvalidSession(f"message {i}: role {m.role!r}; only the first message may be system")
    calls = tuple(_import_call(i, c) for c in m.tool_calls or ())
    content = m.content
    if (calls or m.reasoning_content) and content in (None, msgspec.UNSET):
        content = ""
    if not isinstance(content, str):
        raise InvalidSession(f"message {i}: content must be a string")
    created = stamp if m.created is None else m.created
    if m.role != "assistant" and m.reasoning_content:
        raise InvalidSession(f"message {i}: a {m.role} message cannot have reasoning_content")
    if m.role == "user":
        return Message("user", content, created, calls, m.tool_call_id)
    if m.role == "assistant":
        return Message("assistant", content, created, calls, m.tool_call_id, reasoning=m.reasoning_content or "")
    return Message("tool", content, created, calls, m.tool_call_id)


def import_(data: str | bytes, *, new_id: str | None = None, now: float | None = None) -> Session:
    """Parse an exported document (or a bare OpenAI messages list) into a session; `new_id` renames it."""
    if new_id is not None:
        check_session_id(new_id)
    try:
        parsed = msgspec.json.decode(data, type=_Document | list[_WireMessage])
    except msgspec.DecodeError as err:  # ValidationError is a LlamaDecodeError
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
        if not isinstance(wire[0].content, str):
            raise InvalidSession("message 0: the system message's content must be a string")
        system, wire = wire[0].content, wire[1:]
    messages = [_import_message(i, m, stamp) for i, m in enumerate(wire)]
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
