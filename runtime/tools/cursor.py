"""The cursor the scanner reads a reply with: the reads of `runtime.tools.reader` (a literal next, text up
to a closer, a JSON value that may be cut), the shapes of `runtime.tools.shapes` (LFM2, Gemma 4, harmony)
and here the JSON, name-then-JSON and XML shapes. It raises `_More` when the text stops inside a construct
(a prefix: the caller keeps what is fixed so far) and `_Bad` when the text cannot be the syntax; the calls
it reads go to `calls` as soon as their names are complete.
"""

from __future__ import annotations

import json
from typing import Any

from runtime.tools import partial_json as pj
from runtime.tools.reader import RawCall, _Bad, _More, held_back, string_typed
from runtime.tools.shapes import Shapes

__all__ = ["Cursor", "RawCall", "_Bad", "_More", "held_back", "string_typed"]


class Cursor(Shapes):
    """The reader with one method per shape of `ToolSyntax`."""

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
        elif shape == "pythonic":
            self.pythonic_calls()
        elif shape == "gemma":
            self.gemma_call()
        else:
            raise _Bad(f"no scanner for shape {shape}")

    def json_call(self) -> None:
        s = self.s
        self.expect(s.call_open)
        self.ws()
        if s.args_open:  # a fence around the JSON (Command R+)
            self.expect(s.args_open)
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
        if s.args_close:
            self.expect(s.args_close)
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

    def xml_call(self) -> None:
        s = self.s
        if not (s.bare_open and self.peek(s.bare_open)):
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
        if s.fn_head_end:
            self.until(s.fn_head_end)
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
            closer = s.param_close + (key + s.param_name_end if s.param_close_named else "")
            k = self.text.find(closer, start)
            if k < 0:
                if is_str:  # stream the string as far as it is fixed
                    raw = self.text[start:]
                    raw = raw[: len(raw) - held_back(raw, (closer,))]
                    if s.value_newlines:
                        raw = raw.removeprefix("\n").removesuffix("\n")
                    call.arguments += json.dumps(raw, ensure_ascii=False)[:-1]
                raise _More
            raw = self.text[start:k]
            self.i = k + len(closer)
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
