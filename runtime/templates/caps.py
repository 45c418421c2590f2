"""What a chat template can do, found the way llama.cpp finds it (common/jinja/caps.cpp): the template is run
on probe conversations whose values record how the template used them.

llama.cpp's engine marks a value "used" when the template reads it (a member or item access, a loop over it,
a filter or test applied to it, `tojson` of anything that contains it) and records the operations applied to
it. Here the probe values are `dict` / `list` / `str` subclasses that carry such a record, and a sandbox
subclass marks them on every attribute and item access; `tojson` and `string` mark deeply, the `string` test
and `selectattr` record their operation, and printing a string marks it. The caps decide llama-server's
workarounds (a system message merged into the first user message, tool-call arguments passed as objects,
typed or string content), so they must agree with llama.cpp's on every vendored template; the parity test
checks the renders that depend on them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jinja2

from runtime.templates.engine import ChatSandbox, make_environment, tojson

__all__ = ["TemplateCaps", "template_caps"]


@dataclass(frozen=True)
class TemplateCaps:
    """llama.cpp's `jinja::caps` of one template (the same defaults)."""

    supports_tools: bool = True
    supports_tool_calls: bool = True
    supports_system_role: bool = True
    supports_parallel_tool_calls: bool = True
    supports_preserve_reasoning: bool = False
    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_object_arguments: bool = False


@dataclass
class _Node:
    used: bool = False
    ops: set[str] = field(default_factory=set)


class _TDict(dict[str, Any]):
    node: _Node

    def get(self, key: Any, default: Any = None) -> Any:
        self.node.used = True
        self.node.ops.add("object_access")
        if dict.__contains__(self, key):
            v = dict.__getitem__(self, key)
            _mark(v)
            return v
        return default

    def __iter__(self) -> Iterator[str]:
        self.node.used = True
        self.node.ops.add("object_access")
        return dict.__iter__(self)


class _TList(list[Any]):
    node: _Node

    def __iter__(self) -> Iterator[Any]:
        self.node.used = True
        self.node.ops.add("array_access")
        return list.__iter__(self)


class _TStr(str):
    node: _Node

    def _use(self) -> str:
        self.node.used = True
        return str.__str__(self)

    def __str__(self) -> str:
        return self._use()

    def __eq__(self, other: object) -> bool:
        return self._use() == other

    def __ne__(self, other: object) -> bool:
        return self._use() != other

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __add__(self, other: str) -> str:
        return self._use() + other

    def __radd__(self, other: str) -> str:
        return other + self._use()

    def __len__(self) -> int:
        self._use()
        return str.__len__(self)

    def __contains__(self, other: object) -> bool:
        return str.__contains__(self._use(), other)  # type: ignore[operator]

    def __iter__(self) -> Iterator[str]:
        self.node.ops.add("array_access")
        return iter(self._use())

    def __getitem__(self, key: Any) -> str:
        self.node.ops.add("array_access")
        return self._use()[key]


_Tracked = (_TDict, _TList, _TStr)


def _wrap(v: Any) -> Any:
    w: Any
    if isinstance(v, dict):
        w = _TDict({k: _wrap(x) for k, x in v.items()})
    elif isinstance(v, list):
        w = _TList(_wrap(x) for x in v)
    elif isinstance(v, str):
        w = _TStr(v)
    else:
        return v
    w.node = _Node()
    return w


def _mark(v: Any, deep: bool = False) -> None:
    if isinstance(v, _Tracked):
        v.node.used = True
        if deep and isinstance(v, _TDict):
            for x in dict.values(v):
                _mark(x, True)
        elif deep and isinstance(v, _TList):
            for x in list.__iter__(v):
                _mark(x, True)


def _op(v: Any, name: str) -> None:
    if isinstance(v, _Tracked):
        v.node.used = True
        v.node.ops.add(name)


def _node(v: Any) -> _Node:
    assert isinstance(v, _Tracked)
    return v.node


class _StatsSandbox(ChatSandbox):
    """Marks the probe values a template reads."""

    def getitem(self, obj: Any, argument: Any) -> Any:
        r = super().getitem(obj, argument)
        self._track(obj, argument, r)
        return r

    def getattr(self, obj: Any, attribute: str) -> Any:
        r = super().getattr(obj, attribute)
        self._track(obj, attribute, r)
        return r

    @staticmethod
    def _track(obj: Any, key: Any, r: Any) -> None:
        if isinstance(obj, _Tracked):
            obj.node.used = True
            index = isinstance(key, (int, bool)) and not isinstance(obj, _TDict)
            obj.node.ops.add("array_access" if index else "object_access")
        _mark(r)


def _tojson_stats(value: Any, *args: Any, **kwargs: Any) -> str:
    _mark(value, True)
    return tojson(value, *args, **kwargs)


def _string_stats(value: Any) -> str:
    _mark(value, True)
    return str(value)


@functools.cache
def _stats_env() -> ChatSandbox:
    env = make_environment(_StatsSandbox, tojson=_tojson_stats, string=_string_stats)
    base_selectattr = env.filters["selectattr"]

    def selectattr(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        _op(value, "selectattr")
        return base_selectattr(context, value, *args, **kwargs)

    env.filters["selectattr"] = jinja2.pass_context(selectattr)

    def is_string(value: Any) -> bool:
        _op(value, "test_is_string")
        return isinstance(value, str)

    env.tests["string"] = is_string

    def finalize(value: Any) -> Any:
        _mark(value)
        return value

    env.finalize = finalize
    return env


def _run(source: str, messages: Any, tools: Any, extra: dict[str, Any] | None = None) -> tuple[bool, str]:
    try:
        tmpl = _stats_env().from_string(source)
        ctx: dict[str, Any] = {
            "messages": messages,
            "tools": tools,
            "bos_token": "",
            "eos_token": "",
            "add_generation_prompt": True,
        }
        ctx.update(extra or {})
        return True, tmpl.render(ctx)
    except Exception:  # a probe that fails tells what the template cannot take
        return False, ""


def _tool_probe(args: Any, calls: int = 1) -> list[dict[str, Any]]:
    call = [
        {"id": f"call0000{i + 1}", "type": "function", "function": {"name": "tool1", "arguments": args}}
        for i in range(calls)
    ]
    return [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": call},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]


_TOOLS = [
    {
        "name": "tool",
        "type": "function",
        "function": {
            "name": "tool1",
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }
]

_MARKER = "STRING_MARKER"
_REASONING = "<REASONING_CONTENT_PLACEHOLDER>"


def _apply_preserve(enabled: bool) -> dict[str, Any]:
    return {
        "preserve_thinking": enabled,
        "clear_thinking": not enabled,
        "truncate_history_thinking": not enabled,
        "drop_thinking": not enabled,
    }


@functools.lru_cache(maxsize=64)
def template_caps(source: str) -> TemplateCaps:
    """The caps of a template source, as llama.cpp's `caps_get` computes them (cached per source)."""
    r: dict[str, bool] = {}
    empty: Callable[[], Any] = lambda: _wrap([])  # noqa: E731

    msgs = _wrap([{"role": "user", "content": _MARKER}])
    ok, out = _run(source, msgs, empty())
    cnode = _node(dict.__getitem__(list.__getitem__(msgs, 0), "content"))
    checks_string = "test_is_string" in cnode.ops
    as_array = bool({"selectattr", "array_access"} & cnode.ops)
    if as_array:
        r["supports_typed_content"] = True
    if not ok or (as_array and _MARKER not in out):
        r["supports_string_content"] = False
    if checks_string:
        msgs = _wrap([{"role": "user", "content": []}])
        ok, _ = _run(source, msgs, empty())
        node = _node(dict.__getitem__(list.__getitem__(msgs, 0), "content"))
        if ok and {"selectattr", "array_access"} & node.ops:
            r["supports_typed_content"] = True

    msgs = _wrap([{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}])
    _run(source, msgs, empty())
    if not _node(dict.__getitem__(list.__getitem__(msgs, 0), "content")).used:
        r["supports_system_role"] = False

    def call_nodes(msgs: Any, tools: Any) -> tuple[_Node, _Node, Any]:
        fn = dict.__getitem__(dict.__getitem__(list.__getitem__(tools, 0), "function"), "name")
        calls = dict.__getitem__(list.__getitem__(msgs, 1), "tool_calls")
        return _node(fn), _node(calls), calls

    msgs, tools = _wrap(_tool_probe({"arg": "value"})), _wrap(_TOOLS)
    ok, _ = _run(source, msgs, tools)
    object_args = False
    if ok:
        name, calls, call_list = call_nodes(msgs, tools)
        if not name.used:
            r["supports_tools"] = False
        if not calls.used:
            r["supports_tool_calls"] = False
        else:
            fn = dict.__getitem__(list.__getitem__(call_list, 0), "function")
            arg = dict.__getitem__(dict.__getitem__(fn, "arguments"), "arg")
            object_args = _node(arg).used
    if object_args:
        r["supports_object_arguments"] = True
    else:
        msgs, tools = _wrap(_tool_probe('{"arg": "value"}')), _wrap(_TOOLS)
        ok, _ = _run(source, msgs, tools)
        if not ok:
            r["supports_tool_calls"] = False
            r["supports_tools"] = False
        else:
            name, calls, _ = call_nodes(msgs, tools)
            if not name.used:
                r["supports_tools"] = False
            if not calls.used:
                r["supports_tool_calls"] = False

    args: Any = {"arg": "value"} if object_args else '{"arg": "value"}'
    msgs = _wrap(_tool_probe(args, calls=2))
    ok, _ = _run(source, msgs, _wrap(_TOOLS))
    if not ok:
        r["supports_parallel_tool_calls"] = False
    else:
        calls_list = dict.__getitem__(list.__getitem__(msgs, 1), "tool_calls")
        if not _node(dict.__getitem__(list.__getitem__(calls_list, 1), "function")).used:
            r["supports_parallel_tool_calls"] = False

    history = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": _REASONING},
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
        {"role": "user", "content": "User message"},
    ]
    _, out = _run(source, _wrap(history), empty(), {"enable_thinking": True, **_apply_preserve(True)})
    if _REASONING in out:
        r["supports_preserve_reasoning"] = True
    return TemplateCaps(**r)
