"""The shapes of `ToolSyntax` that are neither JSON nor XML: LFM2's Python calls, Gemma 4's notation and
gpt-oss's harmony recipients, as methods of `Shapes` (a `Reader`), which `runtime.tools.cursor.Cursor`
extends. Python literals are read with `ast.literal_eval`, never evaluated.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from runtime.tools import partial_json as pj
from runtime.tools.reader import RawCall, Reader, _Bad, _More

__all__ = ["Shapes"]

_GQ = '<|"|>'  # Gemma 4's string quote


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


class Shapes(Reader):
    """LFM2, Gemma 4 and harmony calls."""

    def pythonic_calls(self) -> None:
        """LFM2: `call_open` `[` NAME(key=value, ...), ... `]` `call_close`, values Python literals (read by
        `ast.literal_eval`, never evaluated), or JSON."""
        s = self.s
        self.expect(s.call_open)
        self.ws()
        self.expect("[")
        while True:
            self.ws()
            k = self.i
            while k < len(self.text) and (self.text[k].isalnum() or self.text[k] in "_.-"):
                k += 1
            if k == len(self.text):
                raise _More
            name, self.i = self.text[self.i : k], k
            if not name:
                raise _Bad("a call needs a tool name")
            self.expect("(")
            call = RawCall(name, arguments="{")
            self.calls.append(call)
            values: dict[str, Any] = {}
            parts: list[str] = []
            while True:
                self.ws()
                if self.maybe(")"):
                    break
                if parts:
                    self.expect(",")
                    self.ws()
                key, _ = self.until("=")
                key = key.strip()
                if not key.isidentifier():
                    raise _Bad(f"{name}: bad argument name {key!r}")
                call.arguments = "{" + "".join(p + ", " for p in parts) + json.dumps(key, ensure_ascii=False) + ": "
                val = _python_value(self._literal())
                values[key] = val
                parts.append(json.dumps(key, ensure_ascii=False) + ": " + json.dumps(val, ensure_ascii=False))
                call.arguments = "{" + ", ".join(parts)
            call.arguments = "{" + ", ".join(parts) + "}"
            call.value, call.complete = values, True
            self.ws()
            if self.maybe(","):
                continue
            self.expect("]")
            break
        self.ws()
        self.expect(s.call_close, "after the tool calls (not closed)")

    def _literal(self) -> str:
        """The text of one Python literal, up to a `,` or `)` outside brackets and strings."""
        depth, quote, k = 0, "", self.i
        while k < len(self.text):
            c = self.text[k]
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
        if k >= len(self.text):
            raise _More
        out, self.i = self.text[self.i : k].strip(), k
        if not out:
            raise _Bad("an argument without a value")
        return out

    def gemma_call(self) -> None:
        """Gemma 4: `<|tool_call>call:NAME{key:value,...}<tool_call|>`; strings in `<|"|>` quotes, keys bare,
        nested objects and lists in the same notation (JSON is read too)."""
        s = self.s
        self.expect(s.call_open)
        name, _ = self.until("{")
        name = name.strip()
        if not name or any(c in name for c in "<>{}:,\"' \n"):
            raise _Bad(f"bad tool name {name!r}")
        call = RawCall(name, arguments="{")
        self.calls.append(call)
        values: dict[str, Any] = {}
        parts: list[str] = []
        while True:
            self.ws()
            if self.maybe("}"):
                break
            if parts:
                self.expect(",")
                self.ws()
            key = self._gemma_key()
            call.arguments = "{" + "".join(p + ", " for p in parts) + json.dumps(key, ensure_ascii=False) + ": "
            val = self._gemma_value()
            values[key] = val
            parts.append(json.dumps(key, ensure_ascii=False) + ": " + json.dumps(val, ensure_ascii=False))
            call.arguments = "{" + ", ".join(parts)
        call.arguments = "{" + ", ".join(parts) + "}"
        call.value = values
        self.ws()
        self.expect(s.call_close, "after the tool call (not closed)")
        call.complete = True

    def _gemma_key(self) -> str:
        if self.maybe(_GQ):
            key, _ = self.until(_GQ)
        elif self.peek('"'):
            node = self.json_value()
            if not node.complete:
                raise _More
            key = str(node.scalar)
        else:
            key, _ = self.until(":")
            return key.strip()
        self.ws()
        self.expect(":")
        return key

    def _gemma_value(self) -> Any:
        self.ws()
        if self.maybe(_GQ):
            return self.until(_GQ)[0]
        if self.peek('"'):
            node = self.json_value()
            if not node.complete:
                raise _More
            return pj.value(node)
        if self.maybe("{"):
            out: dict[str, Any] = {}
            while True:
                self.ws()
                if self.maybe("}"):
                    return out
                if out:
                    self.expect(",")
                    self.ws()
                key = self._gemma_key()
                out[key] = self._gemma_value()
        if self.maybe("["):
            items: list[Any] = []
            while True:
                self.ws()
                if self.maybe("]"):
                    return items
                if items:
                    self.expect(",")
                items.append(self._gemma_value())
        k = self.i
        while k < len(self.text) and self.text[k] not in ",}]":
            k += 1
        if k == len(self.text):
            raise _More
        word, self.i = self.text[self.i : k].strip(), k
        if word in ("None", "null"):
            return None
        try:
            return json.loads(word)  # numbers, true, false
        except ValueError:
            raise _Bad(f"{word[:40]!r} is not a value") from None

    def harmony_call(self) -> None:
        """gpt-oss: `to=functions.NAME`, the rest of the channel header, `<|message|>`, the JSON arguments,
        then `<|call|>` (or the end of the text, where `<|call|>` stopped generation)."""
        self.expect("to=functions.")
        name, _ = self.until("<|message|>")
        name = name.strip()
        name = name.split("<|channel|>")[0].split("<|constrain|>")[0].split()[0] if name.strip() else ""
        if not name or any(c in name for c in "<>{}\"'"):
            raise _Bad(f"bad tool name {name!r}")
        call = RawCall(name)
        self.calls.append(call)
        node = self.json_value()
        if node.kind == "pending" and self.at_end():
            raise _More
        if node.kind != "object":
            raise _Bad(f"{name}: arguments are not a JSON object")
        self.set_args(call, node)
        if not node.complete:
            raise _More
        self.ws()
        if self.at_end():  # `<|call|>` is a stop: the text ends with the arguments
            call.complete = True
            return
        for end in ("<|call|>", "<|end|>"):
            if self.peek(end) is None:
                raise _More
            if self.maybe(end):
                break
        call.complete = True
