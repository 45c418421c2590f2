"""What a tool is: `Tool` (name, description, JSON-schema parameters, optionally the Python callable), built
from an OpenAI tool dict or from a plain function, and `ToolChoice`, the resolved `tool_choice`.

A function's name, docstring (first paragraph: the description; an `Args:` section: parameter
descriptions) and type-annotated parameters give the tool; msgspec turns the annotations into the JSON
schema and later converts the model's arguments to those types. Parameters with defaults are optional.

A tool's parameters may use JSON-schema keywords no grammar can enforce (`propertyNames`, `if`/`then` …:
coding agents send them): the tool is accepted, the rest of its schema enforced, and a
`tools.schema_partly_enforced` warning names the keyword. (A `response_format` schema with them stays
an `UnsupportedSchema`: there the caller asked for a guarantee.)
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from runtime.errors import InvalidTool, InvalidToolArguments, UnsupportedSchema
from runtime.grammar.enforceable import check_enforceable
from runtime.log import get_logger
from runtime.tools.validate import problem

log = get_logger(__name__)

__all__ = ["Tool", "ToolChoice", "as_tools", "resolve_tool_choice", "string_typed"]

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_ARGS_HEADERS = ("args:", "arguments:", "parameters:", "params:")


@dataclass(frozen=True, eq=False)
class Tool:
    """One callable tool as the model sees it; `function` is set for tools made from Python functions."""

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any] | None = None
    _args_type: type[msgspec.Struct] | None = field(default=None, repr=False)

    @property
    def is_async(self) -> bool:
        """True when `function` is a coroutine function (the agent loop awaits it)."""
        return self.function is not None and inspect.iscoroutinefunction(self.function)

    def openai(self) -> dict[str, Any]:
        """The OpenAI tool dict, keys in llama-server's order (what chat templates get as `tools`)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check_arguments(self, arguments: Any) -> dict[str, Any]:
        """Validate `arguments` against the schema; return them, or raise `InvalidToolArguments`."""
        if not isinstance(arguments, dict):
            raise InvalidToolArguments(self.name, f"arguments must be a JSON object, not {type(arguments).__name__}")
        if self._args_type is not None:
            self.convert_arguments(arguments)
        else:
            bad = problem(arguments, self.parameters)
            if bad is not None:
                raise InvalidToolArguments(self.name, bad)
        return arguments

    def convert_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call `function` with: converted to the annotated types by msgspec."""
        if self._args_type is None:
            return self.check_arguments(arguments)
        try:
            value = msgspec.convert(arguments, type=self._args_type)
        except msgspec.ValidationError as err:
            raise InvalidToolArguments(self.name, str(err)) from None
        return {name: getattr(value, name) for name in value.__struct_fields__}

    @classmethod
    def from_openai(cls, spec: Mapping[str, Any]) -> Tool:
        """Build from `{"type": "function", "function": {"name", "description"?, "parameters"?}}`."""
        if not isinstance(spec, Mapping) or spec.get("type") != "function":
            raise InvalidTool(f"a tool dict needs type 'function': {_show(spec)}")
        fn = spec.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidTool(f"a tool dict needs a 'function' object: {_show(spec)}")
        name = _check_name(fn.get("name"))
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise InvalidTool(f"tool {name!r}: description must be a string")
        parameters = fn.get("parameters")
        if parameters is None or parameters == {}:
            parameters = dict(_EMPTY_PARAMETERS)
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            raise InvalidTool(f"tool {name!r}: parameters must be a JSON schema with type 'object'")
        try:
            parameters = msgspec.json.decode(msgspec.json.encode(parameters))  # a JSON-only deep copy
        except (TypeError, msgspec.DecodeError) as err:
            raise InvalidTool(f"tool {name!r}: parameters are not JSON: {err}") from None
        try:
            check_enforceable(parameters, f"#/tools/{name}/parameters")
        except UnsupportedSchema as err:  # a hint to the model, enforced as far as a grammar can (docstring)
            log.warning("tools.schema_partly_enforced", tool=name, reason=err.reason)
        return cls(name, description, parameters)

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> Tool:
        """Build from a plain (sync or async) function with type-annotated parameters."""
        if not callable(fn):
            raise InvalidTool(f"{_show(fn)} is not a function")
        name = _check_name(getattr(fn, "__name__", None))
        try:
            sig = inspect.signature(fn)
            hints = typing.get_type_hints(fn)
        except (TypeError, ValueError, NameError) as err:
            raise InvalidTool(f"tool {name!r}: cannot read its signature: {err}") from None
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for p in sig.parameters.values():
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                raise InvalidTool(f"tool {name!r}: parameter {p.name!r} is {p.kind.description}; only named ones")
            if p.name not in hints:
                raise InvalidTool(f"tool {name!r}: parameter {p.name!r} has no type annotation")
            fields.append((p.name, hints[p.name]) if p.default is p.empty else (p.name, hints[p.name], p.default))
        description, arg_docs = _parse_doc(inspect.getdoc(fn) or "")
        args_type = msgspec.defstruct(f"{name}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
        parameters = _schema_of(name, args_type)
        for pname, text in arg_docs.items():
            prop = parameters["properties"].get(pname)
            if isinstance(prop, dict) and "description" not in prop:
                prop["description"] = text
        return cls(name, description, parameters, fn, args_type)


def _schema_of(name: str, args_type: type[msgspec.Struct]) -> dict[str, Any]:
    try:
        (_ref,), defs = msgspec.json.schema_components([args_type], ref_template="#/$defs/{name}")
    except (TypeError, ValueError) as err:
        raise InvalidTool(f"tool {name!r}: unsupported parameter annotation: {err}") from None
    schema: dict[str, Any] = dict(defs.pop(args_type.__name__))
    schema.pop("title", None)
    schema.setdefault("properties", {})
    if defs:
        schema["$defs"] = defs
    try:  # plain JSON (tuple defaults become lists)
        plain = msgspec.json.decode(msgspec.json.encode(schema), type=dict[str, Any])
    except (TypeError, ValueError) as err:
        raise InvalidTool(f"tool {name!r}: a default is not JSON: {err}") from None
    out: dict[str, Any] = _without_closed_tuples(plain)
    return out


def _without_closed_tuples(node: Any) -> Any:
    """Drop msgspec's `"items": false` beside "prefixItems" (a fixed-length tuple): llama.cpp's converter
    refuses `false` there, and "prefixItems" with min/maxItems says the same."""
    if isinstance(node, list):
        return [_without_closed_tuples(x) for x in node]
    if not isinstance(node, dict):
        return node
    closed = node.get("items") is False and isinstance(node.get("prefixItems"), list)
    return {k: _without_closed_tuples(v) for k, v in node.items() if not (closed and k == "items")}


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph (lines joined with spaces) and the `Args:` entries of a Google-style docstring."""
    lines = doc.splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip():
            break
        first.append(line.strip())
    args: dict[str, str] = {}
    current: str | None = None
    entry_indent: int | None = None
    inside = False
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.lower() in _ARGS_HEADERS and indent == 0:
            inside, current, entry_indent = True, None, None
            continue
        if not inside or not stripped:
            continue
        if indent == 0:
            inside = False  # the next section
            continue
        match = re.fullmatch(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", stripped)
        if match and (entry_indent is None or indent <= entry_indent):
            current, entry_indent = match.group(1), indent
            args[current] = match.group(2).strip()
        elif current is not None:
            args[current] = (args[current] + " " + stripped).strip()
    return " ".join(first), args


def _check_name(name: object) -> str:
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise InvalidTool(f"tool name {_show(name)} is not 1 to 64 characters of [a-zA-Z0-9_-]")
    return name


def _show(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_tools(tools: Sequence[Tool | Mapping[str, Any] | Callable[..., Any]]) -> tuple[Tool, ...]:
    """Turn tool dicts, functions and `Tool`s into `Tool`s; names must be unique."""
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise InvalidTool("tools must be a list of tool dicts, functions or Tool")
    out: list[Tool] = []
    for item in tools:
        if isinstance(item, Tool):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(Tool.from_openai(item))
        else:
            out.append(Tool.from_function(item))
    names = [t.name for t in out]
    for n in names:
        if names.count(n) > 1:
            raise InvalidTool(f"two tools are named {n!r}")
    return tuple(out)


@dataclass(frozen=True)
class ToolChoice:
    """A resolved `tool_choice`: `auto` (may call), `required` (must call), `none` (must not), `function`
    (must call the tool `name`), or `answer` (the agent loop's: must answer now, in the format's answer shape)."""

    mode: Literal["auto", "required", "none", "function", "answer"]
    name: str | None = None

    def allowed(self, tools: Sequence[Tool]) -> tuple[Tool, ...]:
        """The tools the reply may call under this choice."""
        if self.mode in ("none", "answer"):
            return ()
        if self.mode == "function":
            return tuple(t for t in tools if t.name == self.name)
        return tuple(tools)

    @property
    def must_call(self) -> bool:
        """True when the reply must be a tool call."""
        return self.mode in ("required", "function")


def resolve_tool_choice(choice: object, tools: Sequence[Tool]) -> ToolChoice:
    """Check `choice` ("auto", "required", "none", a tool name, or OpenAI's `{"type": "function", "function":
    {"name": ...}}`) against `tools`; `InvalidTool` for an unknown name or a call required without tools."""
    if isinstance(choice, ToolChoice):
        return choice
    names = {t.name for t in tools}
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise InvalidTool(f"tool_choice {_show(choice)} is not {{'type': 'function', 'function': {{'name': ...}}}}")
        choice = fn["name"]
    if not isinstance(choice, str):
        raise InvalidTool(f"tool_choice must be 'auto', 'required', 'none' or a tool name, not {_show(choice)}")
    if choice == "auto":
        return ToolChoice("auto")
    if choice == "none":
        return ToolChoice("none")
    if choice == "required":
        if not tools:
            raise InvalidTool("tool_choice 'required' needs at least one tool")
        return ToolChoice("required")
    if choice not in names:
        raise InvalidTool(f"tool_choice names {choice!r}, which is not one of the tools {sorted(names)}")
    return ToolChoice("function", choice)


def string_typed(tool: Tool | None, key: str) -> bool:
    """Whether parameter `key` of `tool` is a string (its raw text is the value in the XML and the Python-like
    shapes; an unknown tool or key counts as a string)."""
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
