"""Reading a reply written in a `ToolSyntax`, whole or as a prefix: one scanner for both.

`scan(syntax, text, tools, final)` walks the text: content up to the calls' opener, then the calls in the
family's shape, then (whitespace, or text before another opener) on. With `final=False` the text may stop
anywhere: what is fixed so far comes back (content without a possibly-partial opener or trailing
whitespace at its end; calls whose name is complete, with the canonical JSON text of their arguments so
far), so a prefix never says anything the whole text contradicts. With `final=True` a call that is not
complete or not well formed sets `error` (the caller raises `ToolCallParseError`). Nothing here raises.

Content rules: the text before the first call loses its trailing whitespace; text between calls is
stripped and joined to the content with a blank line; text after the last call is an error (the grammar
never allows it). A reply with no opener is plain content, as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.tools import partial_json as pj
from runtime.tools.families import ToolSyntax
from runtime.tools.spec import Tool

__all__ = ["RawCall", "Scanned", "held_back", "scan", "string_typed"]

_WS = " \t\r\n"
_HARMONY_HEADS = ("<|start|>", "<|channel|>")
# what a harmony call's header leaves before `to=functions.` in the answer part
_HARMONY_TAIL = re.compile(r"(?:<\|end\|>)?\s*(?:<\|start\|>assistant)?\s*(?:<\|channel\|>\w+)?\s*$")


@dataclass
class RawCall:
    """A call as written: its name, the id the model wrote (if any), the canonical JSON text of its arguments
    so far, and, once complete, the arguments' value (a dict, or the JSON string some models send)."""

    name: str
    written_id: str | None = None
    arguments: str = ""
    value: Any = None
    complete: bool = False


@dataclass
class Scanned:
    """What a scan found."""

    content: str
    calls: list[RawCall] = field(default_factory=list)
    error: str | None = None


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


class _Cursor:
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
        except (pj.BadJSON, RecursionError) as err:
            raise _Bad(f"not JSON ({err})") from None
        return node

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    # --- shapes ---
    def block(self) -> None:
        """One calls part from its opener on."""
        s = self.s
        if s.section_open:
            self.expect(s.section_open)
            while True:
                self.ws()
                if s.section_close and self.maybe(s.section_close):
                    return
                if self.at_end():
                    raise _More
                self.call()
                if not s.section_close:
                    self.ws()
                    if self.at_end() or self.peek(s.call_open) is False:
                        return
        else:
            self.call()

    def call(self) -> None:
        shape = self.s.shape
        if shape == "json":
            self.json_call()
        elif shape == "name_json":
            self.name_json_call()
        elif shape == "xml":
            self.xml_call()
        elif shape == "harmony":
            self.harmony_call()
        else:
            raise _Bad(f"no scanner for shape {shape}")

    def json_call(self) -> None:
        s = self.s
        self.expect(s.call_open)
        self.ws()
        node = self.json_value()
        if s.array:
            if node.kind not in ("array", "pending"):
                raise _Bad("the tool calls must be a JSON array")
            for item in node.items:
                self.json_object_call(item)
        else:
            self.json_object_call(node)
        if not node.complete:
            raise _More
        self.ws()
        if s.call_close:
            self.expect(s.call_close, "after the tool call (not closed)")

    def json_object_call(self, node: pj.Node) -> None:
        s = self.s
        if node.kind == "pending":
            raise _More
        if node.kind != "object":
            raise _Bad("a tool call must be a JSON object")
        if s.name_is_key:  # {NAME: {args}}
            if not node.keys:
                if node.complete:
                    raise _Bad("a tool call needs the tool's name as its key")
                raise _More
            if len(node.keys) > 1:
                raise _Bad("a tool call has one key, the tool's name")
            call = RawCall(node.keys[0])
            self.calls.append(call)
            self.set_args(call, node.items[0])
            call.complete = node.complete
            if node.items[0].kind not in ("object", "pending"):
                raise _Bad(f"{call.name}: arguments are not a JSON object")
            return
        name = node.get(s.name_key)
        if name is None or not name.complete:
            if node.complete:
                raise _Bad(f"the call's {s.name_key} is missing, not a string")
            raise _More
        if name.kind != "string":
            raise _Bad(f"the call's name is {name.kind}, not a string")
        call = RawCall(name.scalar)
        self.calls.append(call)
        if s.id_key:
            written = node.get(s.id_key)
            if written is None and not node.complete:  # the id may still come: the call waits for it
                self.calls.pop()
                raise _More
            if written is not None and not written.complete:
                self.calls.pop()
                raise _More
            if written is not None and written.kind in ("string", "scalar"):
                call.written_id = str(written.scalar)
        args = node.get(s.args_key)
        if args is None:
            if node.complete:
                call.value, call.arguments, call.complete = {}, "{}", True
            return
        self.set_args(call, args)
        call.complete = node.complete

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

    def name_json_call(self) -> None:
        s = self.s
        self.expect(s.call_open)
        before_id: str | None = None
        if s.id_before:
            before_id = self.until(s.id_before)[0].strip()
        ends = tuple(e for e in (s.id_open, s.name_close) if e)
        written, end = self.until(*ends)
        name = written.strip()
        written_id: str | None = None
        if end == s.id_open and s.id_open:
            written_id, _ = self.until(s.name_close)
            written_id = written_id.strip()
        if s.name_prefix and name.startswith(s.name_prefix):
            name = name[len(s.name_prefix) :]
        if s.name_index:
            written_id = written.strip()
            base, sep, idx = name.rpartition(":")
            if sep and idx.isdigit():
                name = base
        if not name or any(c in name for c in "<>[]{}\n\"'"):
            raise _Bad(f"bad tool name {name!r}")
        call = RawCall(name, written_id or before_id or None)
        self.calls.append(call)
        self.ws()
        if s.args_open:
            self.expect(s.args_open)
        node = self.json_value()
        if node.kind == "pending" and self.at_end():
            raise _More
        if node.kind != "object":
            raise _Bad(f"{name}: arguments are not a JSON object")
        self.set_args(call, node)
        if not node.complete:
            raise _More
        self.ws()
        if s.args_close:
            self.expect(s.args_close)
            self.ws()
        if s.call_close:
            self.expect(s.call_close, "after the tool call (not closed)")
        call.complete = True

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

    def xml_call(self) -> None:
        s = self.s
        self.expect(s.call_open)
        self.ws()
        self.expect(s.fn_open)
        if s.fn_name_end:
            name, _ = self.until(s.fn_name_end)
        else:  # the name ends at a newline or the first tag (GLM)
            k = self.i
            while k < len(self.text) and self.text[k] not in "\n<":
                k += 1
            if k == len(self.text):
                raise _More
            name, self.i = self.text[self.i : k], k
        name = name.strip()
        if not name or any(c in name for c in "<>=\"'\n"):
            raise _Bad(f"bad tool name {name!r}")
        call = RawCall(name, arguments="{")
        self.calls.append(call)
        tool = self.tool(name)
        values: dict[str, Any] = {}
        parts: list[str] = []
        while True:
            self.ws()
            if s.fn_close and self.maybe(s.fn_close):
                break
            if not s.fn_close and self.peek(s.call_close) is not False:
                if self.peek(s.call_close) is None:
                    raise _More
                break
            self.expect(s.param_open, "(a parameter)")
            key, _ = self.until(s.param_name_end)
            key = key.split('"')[0].strip() if s.param_typed[0] else key.strip()
            done = ", ".join(parts)
            call.arguments = "{" + (done + ", " if parts else "") + json.dumps(key, ensure_ascii=False) + ": "
            if s.value_open:
                self.ws()
                self.expect(s.value_open)
            is_str = string_typed(tool, key)
            start = self.i
            k = self.text.find(s.param_close, start)
            if k < 0:
                if is_str:  # stream the string as far as it is fixed
                    raw = self.text[start:]
                    raw = raw[: len(raw) - held_back(raw, (s.param_close,))]
                    if s.value_newlines:
                        raw = raw.removeprefix("\n").removesuffix("\n")
                    call.arguments += json.dumps(raw, ensure_ascii=False)[:-1]
                raise _More
            raw = self.text[start:k]
            self.i = k + len(s.param_close)
            if s.value_newlines:
                raw = raw.removeprefix("\n").removesuffix("\n")
            val: Any = raw
            if not is_str:
                try:
                    val = json.loads(raw)
                except ValueError:
                    val = raw  # llama-server keeps a value that is not JSON as the string
            values[key] = val
            parts.append(json.dumps(key, ensure_ascii=False) + ": " + json.dumps(val, ensure_ascii=False))
            call.arguments = "{" + ", ".join(parts)
        call.arguments = "{" + ", ".join(parts) + "}"
        call.value = values
        self.ws()
        self.expect(s.call_close, "after the tool call (not closed)")
        call.complete = True


def scan(syntax: ToolSyntax, text: str, tools: Sequence[Tool], final: bool) -> Scanned:
    """Content and calls of `text` (see the module docstring); `final=False` for a prefix."""
    cur = _Cursor(syntax, text, tools, final)
    opener = syntax.opener
    pieces: list[str] = []
    error: str | None = None
    pos = 0
    while True:
        k = text.find(opener, pos)
        if k < 0:
            tail = text[pos:]
            if not final:
                heads = (opener, *_HARMONY_HEADS) if syntax.shape == "harmony" else (opener,)
                tail = tail[: len(tail) - held_back(tail, heads)]
                if syntax.shape == "harmony":  # a channel header still being written may become a call's
                    head = max(tail.rfind(h) for h in _HARMONY_HEADS)
                    if head >= 0 and "<|message|>" not in tail[head:]:
                        tail = tail[:head]
            if cur.calls and tail.strip():
                if final:
                    error = "text after the tool calls"
                else:
                    pieces.append(tail)
            elif not cur.calls:
                pieces.append(tail)
            break
        before = text[pos:k]
        pieces.append(_HARMONY_TAIL.sub("", before) if syntax.shape == "harmony" else before)
        cur.i = k
        try:
            cur.block()
        except _More:
            if final:
                error = "the tool call is not complete JSON or is not closed"
            break
        except _Bad as bad:
            error = str(bad.args[0])
            break
        pos = cur.i
    if not cur.calls and error is None:
        content = pieces[0] if pieces else ""
        if not final:
            content = content.rstrip(_WS)
        return Scanned(content)
    content = pieces[0].rstrip(_WS) if pieces else ""
    for piece in pieces[1:]:
        piece = piece.strip(_WS)
        if piece:
            content = f"{content}\n\n{piece}" if content else piece
    if not final:
        content = content.rstrip(_WS)
        # a call being written whose name is not complete yet is not shown
        calls = [c for c in cur.calls if c.name]
        return Scanned(content, calls)
    return Scanned(content, cur.calls, error)
