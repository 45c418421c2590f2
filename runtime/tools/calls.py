"""What every tool-call parser shares: the parsed reply, fresh call ids, and checking one decoded call."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import InvalidSession, InvalidToolArguments, ToolCallParseError
from runtime.tools.spec import Tool
from sessions.model import ToolCall

__all__ = ["ParsedReply", "decode_json_prefix", "make_call", "new_call_id"]


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into its text and its tool calls (empty when the model answered in plain text)."""

    content: str
    tool_calls: tuple[ToolCall, ...] = field(default=())


def new_call_id() -> str:
    """A fresh call id like OpenAI's: `call_` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


def make_call(name: object, arguments: object, tools: Sequence[Tool], text: str) -> ToolCall:
    """Check a decoded call against the allowed `tools` and return it with a fresh id."""
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
        return ToolCall(new_call_id(), name, arguments)
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
