"""Argument checks for every public Runtime method, run before anything is created or queued.

Each raises a typed error (`InvalidRequest`, `InvalidSessionId`, `InvalidSampling`, `InvalidConfig`) and
changes nothing. Text must be a `str` that UTF-8 can encode: a lone surrogate (`"\\ud800"`) is refused,
not replaced, so what is stored is exactly what was sent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from runtime.errors import InvalidRequest, InvalidSession, InvalidSessionId
from sessions import Sampling, Session, check_session_id, history

__all__ = [
    "check_count",
    "check_index",
    "check_namespace",
    "check_sampling",
    "check_session_id",
    "check_text",
    "check_timeout",
]

_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def check_namespace(value: object) -> str:
    """A key (tenant) name as a namespace: 1 to 64 characters of [A-Za-z0-9._-]."""
    if not isinstance(value, str) or _NAMESPACE.fullmatch(value) is None:
        raise InvalidRequest(f"namespace must be 1 to 64 characters of [A-Za-z0-9._-], not {value!r}")
    return value


def check_text(value: object, name: str = "message") -> str:
    """A str that encodes to UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequest(f"{name} is not valid Unicode text: {e.reason} at index {e.start}") from None
    return value


def check_optional_text(value: object, name: str) -> str | None:
    return None if value is None else check_text(value, name)


def check_timeout(value: object) -> float | None:
    """None, or a positive finite number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"timeout must be None or a positive number of seconds, not {value!r}")
    return float(value)


def check_index(value: object, name: str = "index") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an int, not {type(value).__name__}")
    return value


def check_count(value: object, name: str, low: int = 1) -> int:
    n = check_index(value, name)
    if n < low:
        raise InvalidRequest(f"{name} must be >= {low}, not {n}")
    return n


def check_optional_count(value: object, name: str, low: int = 0) -> int | None:
    return None if value is None else check_count(value, name, low)


def check_sampling(overrides: dict[str, Any]) -> dict[str, Any]:
    """Sampling overrides that `Sampling` accepts (`InvalidSampling` otherwise)."""
    Sampling().with_overrides(**overrides)
    return overrides


def check_metadata(value: object) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise InvalidRequest(f"metadata must be a dict or None, not {type(value).__name__}")
    return value


def check_conversation(messages: object, session_id: str) -> Session:
    """An OpenAI-shaped message list (system first if any, then user / assistant / tool messages) as a
    session with that id, ending with a message to answer; `InvalidRequest` otherwise."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list of message objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object, not {type(m).__name__}")
        if isinstance(m.get("content"), str):
            check_text(m["content"], f"messages[{i}].content")
    try:
        session = history.import_(msgspec.json.encode({"messages": messages}), new_id=_SAFE_ID)
    except (InvalidSession, InvalidSessionId, msgspec.EncodeError) as e:
        raise InvalidRequest(f"messages: {e}") from None
    if not session.messages or session.messages[-1].role == "assistant":
        raise InvalidRequest("messages must end with a message to answer (user or tool), not an assistant reply")
    return msgspec.structs.replace(session, id=session_id)


_SAFE_ID = "conversation"  # import_ wants an id; the caller's is set after


def check_tool_results(results: object) -> dict[str, str]:
    """`{call_id: value}` with values as tool-message text (strings as they are, anything else as JSON)."""
    from runtime.tools import result_text

    if not isinstance(results, Mapping) or not results:
        raise InvalidRequest("tool_results must be a non-empty mapping of call id to result")
    out: dict[str, str] = {}
    for call_id, value in results.items():
        if not isinstance(call_id, str):
            raise InvalidRequest(f"tool_results keys must be call ids (str), not {type(call_id).__name__}")
        out[call_id] = check_text(result_text(value), f"tool result {call_id}")
    return out
