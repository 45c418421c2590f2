"""The scanner's primitives: `RawCall` (a call as written), `_More` / `_Bad` (the text stops inside a construct /
cannot be the syntax), and `Reader`, a position in the text with the reads every shape needs (a literal next,
text up to a closer, a JSON value that may be cut, a call's closers, `key value` arguments). The shapes' readers
(`json_calls`, `xml_calls`, `python_calls`, `gemma_calls`, `harmony_calls`) are functions of a `Reader`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.reasoning.split import held_back
from runtime.tools.parse import partial_json as pj
from runtime.tools.spec import Tool
from runtime.tools.syntax.shapes import ToolSyntax

__all__ = ["RawCall", "Reader", "_Bad", "_More", "held_back", "member", "open_member"]

_WS = " \t\r\n"
NOT_CLOSED = "after the tool call (not closed)"


@dataclass
class RawCall:
    """A call as written: its name, the id the model wrote (if any), the canonical JSON text of its arguments
    so far, and, once complete, the arguments' value (a dict, or the JSON string some models send)."""

    name: str
    written_id: str | None = None
    arguments: str = ""
    value: Any = None


class _More(Exception):
    """The text stopped before the current construct ended."""


class _Bad(Exception):
    """The text cannot be this syntax; `args[0]` says why."""


def member(key: str, value: Any) -> str:
    """One `"key": value` of an arguments object's canonical text."""
    return json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)


def open_member(parts: Sequence[str], key: str) -> str:
    """The canonical text of an arguments object with `parts` done and `key` read, its value not yet."""
    return "{" + "".join(p + ", " for p in parts) + json.dumps(key, ensure_ascii=False) + ": "


class Reader:
    """A position in a reply and the reads every shape needs; the calls read go to `calls` as soon as their
    names are complete."""

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

    def word(self, stops: str) -> str:
        """The text up to the first of the characters `stops` (not consumed); `_More` if none comes yet."""
        k = self.i
        while k < len(self.text) and self.text[k] not in stops:
            k += 1
        if k == len(self.text):
            raise _More
        out, self.i = self.text[self.i : k], k
        return out

    def json_value(self) -> pj.Node:
        try:
            node, self.i = pj.parse(self.text, self.i)
        except (pj._BadJSON, RecursionError) as err:
            raise _Bad(f"not JSON ({err})") from None
        return node

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    # --- what several shapes read ---
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

    def json_arguments(self, call: RawCall) -> None:
        """The call's arguments as one JSON object (streamed into `call.arguments`); `_More` until it is whole."""
        node = self.json_value()
        if node.kind == "pending" and self.at_end():
            raise _More
        if node.kind != "object":
            raise _Bad(f"{call.name}: arguments are not a JSON object")
        self.set_args(call, node)
        if not node.complete:
            raise _More

    def close_call(self, args_close: str = "", call_close: str = "", what: str = NOT_CLOSED) -> None:
        """After a call's arguments: whitespace, `args_close`, whitespace, `call_close` (each when set)."""
        self.ws()
        if args_close:
            self.expect(args_close)
            self.ws()
        self.expect(call_close, what)

    def items(self, close: str, item: Callable[[], object]) -> None:
        """Items separated by `,` (and whitespace) up to `close` (consumed), each read by `item`."""
        first = True
        while True:
            self.ws()
            if self.maybe(close):
                return
            if not first:
                self.expect(",")
                self.ws()
            item()
            first = False

    def keyword_arguments(self, call: RawCall, close: str, key: Callable[[], str], value: Callable[[], Any]) -> None:
        """`KEY VALUE` pairs separated by `,` up to `close` (consumed): `key` reads a key with what follows it,
        `value` a value; each shows in `call.arguments` as soon as its key is read."""
        values: dict[str, Any] = {}
        parts: list[str] = []

        def pair() -> None:
            k = key()
            call.arguments = open_member(parts, k)
            v = values[k] = value()
            parts.append(member(k, v))
            call.arguments = "{" + ", ".join(parts)

        self.items(close, pair)
        call.arguments = "{" + ", ".join(parts) + "}"
        call.value = values
