"""Reading the calls of `XmlShape`: a tagged function, then per argument a tagged key and its value (raw text
for a string parameter, streamed as far as it is fixed; JSON for the others)."""

from __future__ import annotations

import json
from typing import Any

from runtime.tools.parse.reader import RawCall, Reader, _Bad, _More, held_back, member, open_member
from runtime.tools.spec import string_typed
from runtime.tools.syntax.shapes import XmlShape

__all__ = ["xml_call"]


def xml_call(r: Reader, shape: XmlShape) -> None:
    """[`call_open`] `fn_open` NAME `fn_name_end` [header `fn_head_end`] the parameters `fn_close` `call_close`."""
    s = r.s
    if not (shape.bare_open and r.peek(shape.bare_open)):
        r.expect(s.call_open)
        r.ws()
    r.expect(shape.fn_open)
    if shape.fn_name_end:
        name, _ = r.until(shape.fn_name_end)
    else:  # the name ends at a newline or the first tag (GLM)
        name = r.word("\n<")
    name = name.strip()
    if not name or any(c in name for c in "<>=\"'\n"):
        raise _Bad(f"bad tool name {name!r}")
    if shape.fn_head_end:
        r.until(shape.fn_head_end)
    call = RawCall(name, arguments="{")
    r.calls.append(call)
    tool = r.tool(name)
    values: dict[str, Any] = {}
    parts: list[str] = []
    while True:
        r.ws()
        if shape.fn_close and r.maybe(shape.fn_close):
            break
        if not shape.fn_close and r.peek(s.call_close) is not False:
            if r.peek(s.call_close) is None:
                raise _More
            break
        r.expect(shape.param_open, "(a parameter)")
        key, _ = r.until(shape.param_name_end)
        key = key.split('"')[0].strip() if shape.param_typed[0] else key.strip()
        call.arguments = open_member(parts, key)
        if shape.value_open:
            r.ws()
            r.expect(shape.value_open)
        is_str = string_typed(tool, key)
        start = r.i
        closer = shape.param_close + (key + shape.param_name_end if shape.param_close_named else "")
        k = r.text.find(closer, start)
        if k < 0:
            if is_str:  # stream the string as far as it is fixed
                raw = r.text[start:]
                raw = raw[: len(raw) - held_back(raw, (closer,))]
                if shape.value_newlines:
                    raw = raw.removeprefix("\n").removesuffix("\n")
                call.arguments += json.dumps(raw, ensure_ascii=False)[:-1]
            raise _More
        raw = r.text[start:k]
        r.i = k + len(closer)
        if shape.value_newlines:
            raw = raw.removeprefix("\n").removesuffix("\n")
        val: Any = raw
        if not is_str:
            try:
                val = json.loads(raw)
            except ValueError:
                val = raw  # llama-server keeps a value that is not JSON as the string
        values[key] = val
        parts.append(member(key, val))
        call.arguments = "{" + ", ".join(parts)
    call.arguments = "{" + ", ".join(parts) + "}"
    call.value = values
    r.close_call(call_close=s.call_close)
