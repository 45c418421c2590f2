"""Reading the calls of `PythonicShape` (LFM2): `call_open` `[` NAME(key=value, ...), ... `]` `call_close`,
values Python literals, read with `ast.literal_eval` (never evaluated), or JSON."""

from __future__ import annotations

import ast
import json
from functools import partial
from typing import Any

from runtime.tools.parse.reader import RawCall, Reader, _Bad, _More

__all__ = ["pythonic_calls"]


def _python_value(text: str) -> Any:
    """A Python literal (or JSON) as a JSON value; `_Bad` if it is neither."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise _Bad(f"{text[:40]!r} is not a Python literal or JSON") from None
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        raise _Bad(f"{text[:40]!r} is not a JSON value") from None
    return json.loads(json.dumps(value))  # tuples to lists


def pythonic_calls(r: Reader) -> None:
    """All calls of the reply, in one Python list."""
    r.expect(r.s.call_open)
    r.ws()
    r.expect("[")
    while True:
        r.ws()
        k = r.i
        while k < len(r.text) and (r.text[k].isalnum() or r.text[k] in "_.-"):
            k += 1
        if k == len(r.text):
            raise _More
        name, r.i = r.text[r.i : k], k
        if not name:
            raise _Bad("a call needs a tool name")
        r.expect("(")
        call = RawCall(name, arguments="{")
        r.calls.append(call)
        r.keyword_arguments(call, ")", partial(_key, r, name), lambda: _python_value(_literal(r)))
        r.ws()
        if r.maybe(","):
            continue
        r.expect("]")
        break
    r.close_call(call_close=r.s.call_close, what="after the tool calls (not closed)")


def _key(r: Reader, name: str) -> str:
    key = r.until("=")[0].strip()
    if not key.isidentifier():
        raise _Bad(f"{name}: bad argument name {key!r}")
    return key


def _literal(r: Reader) -> str:
    """The text of one Python literal, up to a `,` or `)` outside brackets and strings."""
    depth, quote, k = 0, "", r.i
    while k < len(r.text):
        c = r.text[k]
        if quote:
            if c == "\\":
                k += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        k += 1
    if k >= len(r.text):
        raise _More
    out, r.i = r.text[r.i : k].strip(), k
    if not out:
        raise _Bad("an argument without a value")
    return out
