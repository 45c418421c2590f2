"""Reading the calls of the two JSON shapes: `JsonShape` (each call a JSON object, or one JSON array of them)
and `NameJsonShape` (the name as text, then the arguments as a JSON object)."""

from __future__ import annotations

from runtime.tools.parse import partial_json as pj
from runtime.tools.parse.reader import RawCall, Reader, _Bad, _More
from runtime.tools.syntax.shapes import JsonShape, NameJsonShape

__all__ = ["json_call", "name_json_call"]


def json_call(r: Reader, shape: JsonShape) -> None:
    """`call_open` [`args_open`] a JSON call object or array [`args_close`] `call_close`."""
    r.expect(r.s.call_open)
    r.ws()
    if shape.args_open:  # a fence around the JSON (Command R+)
        r.expect(shape.args_open)
        r.ws()
    node = r.json_value()
    if shape.array:
        if node.kind not in ("array", "pending"):
            raise _Bad("the tool calls must be a JSON array")
        for item in node.items:
            _object_call(r, shape, item)
    else:
        _object_call(r, shape, node)
    if not node.complete:
        raise _More
    r.close_call(shape.args_close, r.s.call_close)


def _object_call(r: Reader, shape: JsonShape, node: pj.Node) -> None:
    if node.kind == "pending":
        raise _More
    if node.kind != "object":
        raise _Bad("a tool call must be a JSON object")
    if shape.name_is_key:  # {NAME: {args}}
        if not node.keys:
            if node.complete:
                raise _Bad("a tool call needs the tool's name as its key")
            raise _More
        if len(node.keys) > 1:
            raise _Bad("a tool call has one key, the tool's name")
        call = RawCall(node.keys[0])
        r.calls.append(call)
        r.set_args(call, node.items[0])
        if node.items[0].kind not in ("object", "pending"):
            raise _Bad(f"{call.name}: arguments are not a JSON object")
        return
    name = node.get(shape.name_key)
    if name is None or not name.complete:
        if node.complete:
            raise _Bad(f"the call's {shape.name_key} is missing, not a string")
        raise _More
    if name.kind != "string":
        raise _Bad(f"the call's name is {name.kind}, not a string")
    call = RawCall(name.scalar)
    r.calls.append(call)
    if shape.id_key:
        written = node.get(shape.id_key)
        if (written is None and not node.complete) or (written is not None and not written.complete):
            r.calls.pop()  # the id may still come: the call waits for it
            raise _More
        if written is not None and written.kind in ("string", "scalar"):
            call.written_id = str(written.scalar)
    args = node.get(shape.args_key)
    if args is None:
        if node.complete:
            call.value, call.arguments = {}, "{}"
        return
    r.set_args(call, args)


def name_json_call(r: Reader, shape: NameJsonShape) -> None:
    """`call_open` [ID `id_before`] NAME [`id_open` ID] `name_close` [`args_open`] {args} [`args_close`]
    `call_close`."""
    r.expect(r.s.call_open)
    before_id: str | None = None
    if shape.id_before:
        before_id = r.until(shape.id_before)[0].strip()
    ends = tuple(e for e in (shape.id_open, shape.name_close) if e)
    written, end = r.until(*ends)
    name = written.strip()
    written_id: str | None = None
    if end == shape.id_open and shape.id_open:
        written_id, _ = r.until(shape.name_close)
        written_id = written_id.strip()
    if shape.name_prefix and name.startswith(shape.name_prefix):
        name = name[len(shape.name_prefix) :]
    if shape.name_index:
        written_id = written.strip()
        base, sep, idx = name.rpartition(":")
        if sep and idx.isdigit():
            name = base
    if not name or any(c in name for c in "<>[]{}\n\"'"):
        raise _Bad(f"bad tool name {name!r}")
    call = RawCall(name, written_id or before_id or None)
    r.calls.append(call)
    r.ws()
    if shape.args_open:
        r.expect(shape.args_open)
    r.json_arguments(call)
    r.close_call(shape.args_close, r.s.call_close)
