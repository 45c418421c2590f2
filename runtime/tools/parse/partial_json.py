"""JSON that may still be being written: parse a prefix of a JSON value, and give the canonical text of it.

`parse(text, i)` reads the JSON value at `text[i:]` and returns a `Node` tree and the index after it; a
value cut by the end of `text` comes back incomplete (objects, arrays and strings hold what they have so
far; a number or literal still being written has no value yet), and text that can no longer become JSON
raises `_BadJSON`. `canonical(node)` is the JSON text of a node in `json.dumps(value, ensure_ascii=False)`
form; for an incomplete node it is the part of that text already fixed, so for every prefix of a value the
canonical text is a prefix of the complete value's canonical text (the streaming invariant of tool-call
arguments). Numbers appear once a delimiter ends them, in Python's form (`1.50` becomes `1.5`); a string's
characters appear as they are decoded (an escape still being written is held back, and so is a lone high
surrogate until its pair comes). Duplicate keys are kept as written (the canonical text then differs from
`json.dumps(json.loads(...))`, which keeps the last).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Node", "_BadJSON", "canonical", "parse", "value"]

_WS = " \t\r\n"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_LITERALS = {"true": True, "false": False, "null": None, "NaN": float("nan"), "Infinity": float("inf")}  # as json.loads
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _BadJSON(Exception):
    """The text cannot be (a prefix of) JSON; `args[0]` says why."""


@dataclass
class Node:
    """A JSON value, possibly incomplete. `kind`: object, array, string, scalar (a number or literal, complete
    when `complete`), pending (a number or literal still being written)."""

    kind: str
    complete: bool
    scalar: Any = None  # scalar: the value; string: the decoded text so far
    items: list[Node] = field(default_factory=list)  # array items; object values
    keys: list[str] = field(default_factory=list)  # object keys (complete ones)
    partial_key: str | None = None  # object: a key still being written (decoded so far)

    def get(self, key: str) -> Node | None:
        """An object's member `key` (the last one written), if present."""
        for k, v in zip(reversed(self.keys), reversed(self.items), strict=True):
            if k == key:
                return v
        return None


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def parse(text: str, i: int = 0) -> tuple[Node, int]:
    """The value at `text[i:]` (after whitespace) and the index after it (`len(text)` when incomplete)."""
    i = _ws(text, i)
    if i >= len(text):
        return Node("pending", False), i
    c = text[i]
    if c == "{":
        return _object(text, i + 1)
    if c == "[":
        return _array(text, i + 1)
    if c == '"':
        s, j, done = _string(text, i + 1)
        return Node("string", done, s), j
    if text.startswith("-Infinity", i) or (
        len(text) - i < 9 and "-Infinity".startswith(text[i:]) and len(text) - i > 1
    ):
        if text.startswith("-Infinity", i):
            return Node("scalar", True, float("-inf")), i + 9
        return Node("pending", False), len(text)
    m = _NUMBER_PREFIX.match(text, i)
    if c in "-0123456789" and m is not None:
        j = m.end()
        if j == len(text):
            return Node("pending", False), j
        full = _NUMBER.fullmatch(text, i, j)
        if full is None:
            raise _BadJSON(f"bad number at {i}")
        return Node("scalar", True, json.loads(text[i:j])), j
    for word, val in _LITERALS.items():
        if text.startswith(word, i):
            return Node("scalar", True, val), i + len(word)
        if word.startswith(text[i:]):
            return Node("pending", False), len(text)
    raise _BadJSON(f"unexpected {c!r} at {i}")


def _string(text: str, i: int) -> tuple[str, int, bool]:
    out: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return "".join(out), i + 1, True
        if c == "\\":
            if i + 1 >= n:
                return "".join(out), n, False
            e = text[i + 1]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                i += 2
                continue
            if e != "u":
                raise _BadJSON(f"bad escape at {i}")
            hexs = text[i + 2 : i + 6]
            if len(hexs) < 4:
                if not all(h in "0123456789abcdefABCDEF" for h in hexs):
                    raise _BadJSON(f"bad escape at {i}")
                return "".join(out), n, False
            try:
                code = int(hexs, 16)
            except ValueError:
                raise _BadJSON(f"bad escape at {i}") from None
            i += 6
            if 0xD800 <= code < 0xDC00:  # a high surrogate: its pair must follow
                if i >= n or (text.startswith("\\", i) and i + 6 > n):
                    return "".join(out), n, False
                if text.startswith("\\u", i):
                    try:
                        low = int(text[i + 2 : i + 6], 16)
                    except ValueError:
                        raise _BadJSON(f"bad escape at {i}") from None
                    if 0xDC00 <= low < 0xE000:
                        out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                        i += 6
                        continue
            out.append(chr(code))
            continue
        if c < " ":
            raise _BadJSON(f"control character in a string at {i}")
        out.append(c)
        i += 1
    return "".join(out), n, False


def _open(kind: str, close: str, text: str, i: int) -> tuple[Node, int, bool]:
    """An object or array whose opener ends at `i`: the node, where its first member starts, whether it has one
    (False: it closed at once, complete)."""
    node = Node(kind, False)
    i = _ws(text, i)
    if i < len(text) and text[i] == close:
        node.complete = True
        return node, i + 1, False
    return node, i, True


def _next(node: Node, close: str, text: str, i: int) -> tuple[bool, int]:
    """After a complete member of `node`: (True, the index after its `,`) when another follows, else (False,
    where the node stops: after `close`, marked complete, or the end of the text)."""
    i = _ws(text, i)
    if i >= len(text):
        return False, i
    if text[i] == close:
        node.complete = True
        return False, i + 1
    if text[i] != ",":
        raise _BadJSON(f"expected ',' or {close!r} at {i}")
    return True, i + 1


def _object(text: str, i: int) -> tuple[Node, int]:
    node, i, more = _open("object", "}", text, i)
    while more:
        i = _ws(text, i)
        if i >= len(text):
            return node, i
        if text[i] != '"':
            raise _BadJSON(f"expected a key at {i}")
        key, i, done = _string(text, i + 1)
        if not done:
            node.partial_key = key
            return node, i
        i = _ws(text, i)
        if i >= len(text):
            node.partial_key = key
            return node, i
        if text[i] != ":":
            raise _BadJSON(f"expected ':' at {i}")
        val, i = parse(text, i + 1)
        node.keys.append(key)
        node.items.append(val)
        if not val.complete:
            return node, i
        more, i = _next(node, "}", text, i)
    return node, i


def _array(text: str, i: int) -> tuple[Node, int]:
    node, i, more = _open("array", "]", text, i)
    while more:
        val, i = parse(text, i)
        if i >= len(text) and val.kind == "pending":
            return node, i
        node.items.append(val)
        if not val.complete:
            return node, i
        more, i = _next(node, "]", text, i)
    return node, i


def value(node: Node) -> Any:
    """The Python value of a complete node."""
    if node.kind == "object":
        return {k: value(v) for k, v in zip(node.keys, node.items, strict=True)}
    if node.kind == "array":
        return [value(v) for v in node.items]
    return node.scalar


def _dumps(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def canonical(node: Node) -> str:
    """The canonical JSON text of `node`, or of as much of it as is fixed (see the module docstring)."""
    if node.kind == "scalar":
        return json.dumps(node.scalar, ensure_ascii=False)
    if node.kind == "pending":
        return ""
    if node.kind == "string":
        text = _dumps(node.scalar)
        return text if node.complete else text[:-1]
    if node.kind == "array":
        body = ", ".join(canonical(v) for v in node.items)
        return "[" + body + ("]" if node.complete else "")
    parts = [f"{_dumps(k)}: {canonical(v)}" for k, v in zip(node.keys, node.items, strict=True)]
    if node.complete:
        return "{" + ", ".join(parts) + "}"
    if node.partial_key is not None:
        parts.append(_dumps(node.partial_key)[:-1])
    return "{" + ", ".join(parts)
