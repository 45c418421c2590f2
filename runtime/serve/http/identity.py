"""A conversation's identity from what coding agents already send, besides turnstile's own `X-Session-Id`:

- headers: `X-Session-Id`, Claude Code's `X-Claude-Code-Session-Id`, Codex's `session_id` /
  `conversation_id` (either spelling, `_` or `-`), in that order;
- the body: `prompt_cache_key` (Responses, chat completions: Codex sends its conversation id there), or
  Messages' `metadata.user_id` (Claude Code's `user_…_account_…_session_<uuid>`, or a JSON object with a
  `session_id`: its session part; another value: the whole value).

The identity is a hint, never a capability: it names the conversation for routing (the Ray router's
affinity key) and for logs; it does not make a request stateful (only `X-Session-Id` does, as before) and
it never reaches another tenant's ids (the key's tenant name prefixes it). The cache needs no identity to
find a state: the lookup rule works on tokens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = ["HEADERS", "conversation_of"]

HEADERS = (
    b"x-session-id",
    b"x-claude-code-session-id",
    b"session_id",
    b"session-id",
    b"conversation_id",
    b"conversation-id",
)
MAX_LENGTH = 128
_SESSION_PART = re.compile(r"_session_([0-9A-Za-z-]{8,64})$")


class _Hints(msgspec.Struct):
    prompt_cache_key: str | None = None
    metadata: dict[str, Any] | None = None


_hints = msgspec.json.Decoder(_Hints)


def _user_id(metadata: Mapping[str, Any] | None) -> str | None:
    value = metadata.get("user_id") if metadata is not None else None
    if not isinstance(value, str) or not value:
        return None
    m = _SESSION_PART.search(value)
    if m is not None:
        return m.group(1)
    if value.startswith("{"):
        try:
            parsed = msgspec.json.decode(value)
        except msgspec.DecodeError:
            return value
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        return session if isinstance(session, str) and session else value
    return value


def conversation_of(headers: Mapping[bytes, bytes], body: bytes, tenant: str | None = None) -> str | None:
    """The conversation a request names (module docstring), `tenant/`-prefixed when a tenant is given;
    None when it names none. At most `MAX_LENGTH` characters of the client's value are used."""
    found: str | None = None
    for name in HEADERS:
        value = headers.get(name)
        if value:
            found = value.decode("latin-1")
            break
    if found is None:
        try:
            hints = _hints.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            hints = _Hints()
        found = hints.prompt_cache_key or _user_id(hints.metadata)
    if not found:
        return None
    found = found[:MAX_LENGTH]
    return f"{tenant}/{found}" if tenant else found
