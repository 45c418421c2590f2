"""What every tool-call parser shares: the parsed reply, fresh call ids, and checking one decoded call."""

from __future__ import annotations

import hashlib
import json
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import InvalidSession, InvalidToolArguments, ToolCallParseError
from runtime.tools.spec import Tool
from sessions.model import ToolCall

__all__ = [
    "ID_STYLES",
    "ParsedReply",
    "PartialCall",
    "PartialReply",
    "call_id",
    "canonical_arguments",
    "decode_json_prefix",
    "make_call",
    "new_call_id",
    "reply_seed",
]

ID_STYLES = ("openai", "mistral", "kimi")


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into its text and its tool calls (empty when the model answered in plain text)."""

    content: str
    tool_calls: tuple[ToolCall, ...] = field(default=())


@dataclass(frozen=True)
class PartialCall:
    """One tool call as far as a streamed reply has written it.

    `index` counts the reply's calls from 0; `id` and `name` are final once the call appears (a call only
    appears once its name is complete); `arguments` is a prefix of the final arguments' canonical JSON text
    (`canonical_arguments`), growing as more of the reply arrives (OpenAI's `delta.tool_calls` semantics).
    """

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class PartialReply:
    """What a prefix of a reply says so far: its content (a prefix of the final content: text that may still
    become a call opener, or whitespace that may still be stripped, is held back) and its calls so far."""

    content: str
    calls: tuple[PartialCall, ...] = field(default=())


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """The canonical JSON text of a call's arguments, which streamed `PartialCall.arguments` are prefixes of:
    `json.dumps(arguments, ensure_ascii=False)` (separators `, ` and `: `, keys in the model's order)."""
    return json.dumps(arguments, ensure_ascii=False)


def new_call_id() -> str:
    """A fresh call id like OpenAI's: `call_` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


_ALNUM = string.ascii_letters + string.digits
_SALT = secrets.token_hex(8)  # per process: seeds of two runs never give the same ids


def reply_seed(key: object) -> str:
    """The id seed of one reply, from something unique to it in this process (the request's job id): the
    streamed calls (`ToolPlan.partial`) and the final parse (`ToolPlan.parse`) take the same one."""
    return f"{_SALT}:{key}"


def call_id(seed: str | None, index: int, style: str = "openai", name: str = "") -> str:
    """The id of a reply's call number `index` in a template's id style.

    With a `seed` (one per reply, e.g. the request id) the id is a function of (seed, index), so every
    prefix of a streamed reply and its final parse agree; without one it is random. Styles: `openai`
    (`call_` + 24 hex digits), `mistral` (9 alphanumerics, what Mistral templates check), `kimi`
    (`functions.NAME:INDEX`, what Kimi K2's template renders back).
    """
    if style == "kimi":
        return f"functions.{name}:{index}"
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest() if seed is not None else secrets.token_bytes(32)
    if style == "mistral":
        return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])
    return "call_" + digest[:12].hex()


def make_call(
    name: object, arguments: object, tools: Sequence[Tool], text: str, call_id: str | None = None
) -> ToolCall:
    """Check a decoded call against the allowed `tools` and return it with `call_id` (default: a fresh id)."""
    if not isinstance(name, str):
        raise ToolCallParseError(f"the call's name is {type(name).__name__}, not a string", text)
    tool = next((t for t in tools if t.name == name), None)
    if tool is None:
        raise ToolCallParseError(f"the model called {name!r}, which is not one of {[t.name for t in tools]}", text)
    if isinstance(arguments, str):  # some models send arguments JSON-encoded, as OpenAI's API does
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ToolCallParseError(f"{name}: arguments are a string that is not JSON", text) from None
    if not isinstance(arguments, dict):
        raise ToolCallParseError(f"{name}: arguments are {type(arguments).__name__}, not a JSON object", text)
    try:
        tool.check_arguments(arguments)
    except InvalidToolArguments as err:
        raise ToolCallParseError(str(err), text) from None
    try:
        return ToolCall(call_id or new_call_id(), name, arguments)
    except InvalidSession as err:  # NaN, or an int beyond 64 bits
        raise ToolCallParseError(f"{name}: {err}", text) from None


def decode_json_prefix(text: str, start: int, what: str) -> tuple[Any, int]:
    """Decode the JSON value at `text[start:]` (after whitespace); return it and the index after it."""
    i = start
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    try:
        return json.JSONDecoder().raw_decode(text, i)
    except (ValueError, RecursionError) as err:
        raise ToolCallParseError(f"{what} is not complete JSON ({err.args[0] if err.args else err})", text) from None
