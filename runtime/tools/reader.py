"""The scanner's primitives: `RawCall` (a call as written), `_More` / `_Bad` (the text stops inside a construct /
cannot be the syntax), and `Reader`, a position in the text with the reads every shape needs (a literal
next, text up to a closer, a JSON value that may be cut). `runtime.tools.cursor` adds the shapes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.tools import partial_json as pj
from runtime.tools.families import ToolSyntax
from runtime.tools.spec import Tool

__all__ = ["RawCall", "Reader", "_Bad", "_More", "held_back", "string_typed"]

_WS = " \t\r\n"


@dataclass
class RawCall:
    """A call as written: its name, the id the model wrote (if any), the canonical JSON text of its arguments
    so far, and, once complete, the arguments' value (a dict, or the JSON string some models send)."""

    name: str
    written_id: str | None = None
    arguments: str = ""
    value: Any = None
    complete: bool = False


class _More(Exception):
    """The text stopped before the current construct ended."""


class _Bad(Exception):
    """The text cannot be this syntax; `args[0]` says why."""


def held_back(text: str, tags: Sequence[str]) -> int:
    """How many characters at the end of `text` are a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


def string_typed(tool: Tool | None, key: str) -> bool:
    """Whether parameter `key` of `tool` is a string (its raw text is the value in the XML shapes)."""
    if tool is None:
        return True
    props = tool.parameters.get("properties")
    spec = props.get(key) if isinstance(props, dict) else None
    if not isinstance(spec, dict):
        return True
    kind = spec.get("type")
    if kind is None and "enum" in spec:
        return all(isinstance(v, str) for v in spec["enum"])
    if isinstance(kind, list):
        return kind == ["string"] or (set(kind) <= {"string", "null"} and "string" in kind)
    return kind == "string" or (kind is None and "const" in spec and isinstance(spec["const"], str))


class Reader:
    """A position in a reply and the reads every shape needs."""

    def __init__(self, syntax: ToolSyntax, text: str, tools: Sequence[Tool], final: bool) -> None:
        self.s, self.text, self.tools, self.final = syntax, text, tools, final
        self.i = 0
        self.calls: list[RawCall] = []

    # --- primitives ---
    def ws(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in _WS:
            self.i += 1

    def at_end(self) -> bool:
        return self.i >= len(self.text)

    def peek(self, lit: str) -> bool | None:
        """True if `lit` is next, None if the text ends inside it (may still come), False if not."""
        rest = self.text[self.i : self.i + len(lit)]
        if rest == lit:
            return True
        if len(rest) < len(lit) and lit.startswith(rest):
            return None
        return False

    def expect(self, lit: str, what: str = "") -> None:
        if not lit:
            return
        got = self.peek(lit)
        if got is None:
            raise _More
        if not got:
            raise _Bad(f"expected {lit!r}{' ' + what if what else ''} at {self.i}")
        self.i += len(lit)

    def maybe(self, lit: str) -> bool:
        """Consume `lit` if it is next; `_More` if the text ends inside it."""
        if not lit:
            return False
        got = self.peek(lit)
        if got is None:
            raise _More
        if got:
            self.i += len(lit)
        return bool(got)

    def until(self, *ends: str) -> tuple[str, str]:
        """The text up to the first of `ends` and which end it was (consumed); `_More` if none comes yet."""
        best, which = -1, ""
        for end in ends:
            k = self.text.find(end, self.i)
            if k >= 0 and (best < 0 or k < best):
                best, which = k, end
        if best < 0:
            raise _More
        out = self.text[self.i : best]
        self.i = best + len(which)
        return out, which

    def json_value(self) -> pj.Node:
        try:
            node, self.i = pj.parse(self.text, self.i)
        except (pj._BadJSON, RecursionError) as err:
            raise _Bad(f"not JSON ({err})") from None
        return node

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    # --- shapes ---

    def set_args(self, call: RawCall, args: pj.Node) -> None:
        if args.kind == "string":  # arguments JSON-encoded, as OpenAI's API sends them
            if args.complete:
                call.value = args.scalar
                try:
                    call.arguments = json.dumps(json.loads(args.scalar), ensure_ascii=False)
                except ValueError:
                    call.arguments = ""
            return
        call.arguments = pj.canonical(args)
        if args.complete:
            call.value = pj.value(args)
