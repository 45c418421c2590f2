"""Reading the calls of `GemmaShape` (Gemma 4): `<|tool_call>call:NAME{key:value,...}<tool_call|>`; strings in
`<|"|>` quotes, keys bare, nested objects and lists in the same notation (JSON is read too)."""

from __future__ import annotations

import json
from typing import Any

from runtime.tools.parse import partial_json as pj
from runtime.tools.parse.reader import RawCall, Reader, _Bad, _More

__all__ = ["gemma_call"]

_GQ = '<|"|>'  # Gemma 4's string quote


def gemma_call(r: Reader) -> None:
    """One call, `call_open` NAME `{` the arguments `}` `call_close`."""
    r.expect(r.s.call_open)
    name, _ = r.until("{")
    name = name.strip()
    if not name or any(c in name for c in "<>{}:,\"' \n"):
        raise _Bad(f"bad tool name {name!r}")
    call = RawCall(name, arguments="{")
    r.calls.append(call)
    r.keyword_arguments(call, "}", lambda: _key(r), lambda: _value(r))
    r.close_call(call_close=r.s.call_close)


def _key(r: Reader) -> str:
    if r.maybe(_GQ):
        key, _ = r.until(_GQ)
    elif r.peek('"'):
        node = r.json_value()
        if not node.complete:
            raise _More
        key = str(node.scalar)
    else:
        key, _ = r.until(":")
        return key.strip()
    r.ws()
    r.expect(":")
    return key


def _value(r: Reader) -> Any:
    r.ws()
    if r.maybe(_GQ):
        return r.until(_GQ)[0]
    if r.peek('"'):
        node = r.json_value()
        if not node.complete:
            raise _More
        return pj.value(node)
    if r.maybe("{"):
        out: dict[str, Any] = {}

        def member() -> None:
            key = _key(r)
            out[key] = _value(r)

        r.items("}", member)
        return out
    if r.maybe("["):
        items: list[Any] = []
        r.items("]", lambda: items.append(_value(r)))
        return items
    word = r.word(",}]").strip()
    if word in ("None", "null"):
        return None
    try:
        return json.loads(word)  # numbers, true, false
    except ValueError:
        raise _Bad(f"{word[:40]!r} is not a value") from None
