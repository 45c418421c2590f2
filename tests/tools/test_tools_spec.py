"""Tool definitions from OpenAI dicts and Python functions; tool_choice; argument checks."""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec
import pytest

from runtime.errors import InvalidTool, InvalidToolArguments, TurnstileError
from runtime.tools import Tool, ToolChoice, as_tools, resolve_tool_choice

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}


def add(a: int, b: int = 2) -> int:
    """Add two integers.

    Longer text that is not part of the description.

    Args:
        a: the first number,
            on two lines.
        b (int): the second number.

    Returns:
        The sum.
    """
    return a + b


async def fetch(url: str, *, retries: int = 0, tags: list[str] | None = None) -> str:
    """Fetch a page."""
    return url


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(msgspec.Struct):
    x: float
    y: float


def paint(color: Color, at: Point, mode: Literal["fill", "line"] = "fill") -> None:
    """Paint."""


def test_from_openai() -> None:
    t = Tool.from_openai(WEATHER)
    assert (t.name, t.description, t.function, t.is_async) == ("get_weather", "Weather in a city.", None, False)
    assert t.parameters == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert t.parameters is not WEATHER["function"]["parameters"]  # type: ignore[index]
    assert t.openai() == WEATHER
    bare = Tool.from_openai({"type": "function", "function": {"name": "now"}})
    assert bare.openai() == {
        "type": "function",
        "function": {"name": "now", "description": "", "parameters": {"type": "object", "properties": {}}},
    }


@pytest.mark.parametrize(
    "spec",
    [
        {"function": WEATHER["function"]},
        {"type": "code", "function": WEATHER["function"]},
        {"type": "function"},
        {"type": "function", "function": {"name": "bad name"}},
        {"type": "function", "function": {"name": ""}},
        {"type": "function", "function": {"name": "x" * 65}},
        {"type": "function", "function": {"name": 3}},
        {"type": "function", "function": {"name": "f", "description": 3}},
        {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}},
        {"type": "function", "function": {"name": "f", "parameters": [1]}},
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "default": object()}}},
        "get_weather",
    ],
)
def test_from_openai_refuses(spec: Any) -> None:
    with pytest.raises(InvalidTool):
        as_tools([spec])


def test_from_function() -> None:
    t = Tool.from_function(add)
    assert (t.name, t.description, t.function, t.is_async) == ("add", "Add two integers.", add, False)
    assert t.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number, on two lines."},
            "b": {"type": "integer", "default": 2, "description": "the second number."},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    f = Tool.from_function(fetch)
    assert f.is_async and f.description == "Fetch a page."
    assert f.parameters["required"] == ["url"]
    assert f.parameters["properties"]["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "default": None,
    }


def test_from_function_with_structured_parameters() -> None:
    t = Tool.from_function(paint)
    props = t.parameters["properties"]
    assert props["mode"] == {"enum": ["fill", "line"], "default": "fill"}
    assert props["color"] == {"$ref": "#/$defs/Color"}
    assert t.parameters["$defs"]["Color"]["enum"] == ["blue", "red"]
    assert t.parameters["$defs"]["Point"]["required"] == ["x", "y"]
    kwargs = t.convert_arguments({"color": "red", "at": {"x": 1, "y": 2.5}})
    assert kwargs == {"color": Color.RED, "at": Point(1.0, 2.5), "mode": "fill"}
    with pytest.raises(InvalidToolArguments, match="paint"):
        t.convert_arguments({"color": "green", "at": {"x": 1, "y": 2}})
    with pytest.raises(InvalidToolArguments):
        t.check_arguments({"color": "red", "at": {"x": 1, "y": 2}, "extra": 1})


def unannotated(a, b: int) -> int:  # type: ignore[no-untyped-def]
    return int(a) + b


def star_args(*xs: int) -> int:
    return sum(xs)


def star_kwargs(**kw: int) -> int:
    return len(kw)


def positional_only(a: int, /) -> int:
    return a


class Opaque:
    pass


def opaque(o: Opaque) -> None:
    pass


def bad_default(x: int = object()) -> None:  # type: ignore[assignment]
    pass


@pytest.mark.parametrize(
    "fn", [unannotated, star_args, star_kwargs, positional_only, opaque, bad_default, lambda x: x, 3, print]
)
def test_from_function_refuses(fn: Any) -> None:
    with pytest.raises(InvalidTool):
        as_tools([fn])


def test_as_tools_mixes_and_checks_names() -> None:
    tools = as_tools([WEATHER, add, Tool.from_function(fetch)])
    assert [t.name for t in tools] == ["get_weather", "add", "fetch"]
    with pytest.raises(InvalidTool, match="'add'"):
        as_tools([add, {"type": "function", "function": {"name": "add"}}])
    with pytest.raises(InvalidTool):
        as_tools(WEATHER)  # type: ignore[arg-type]
    assert issubclass(InvalidTool, TurnstileError) and issubclass(InvalidTool, ValueError)


def test_check_arguments_of_dict_tools() -> None:
    t = Tool.from_openai(WEATHER)
    assert t.check_arguments({"city": "Paris"}) == {"city": "Paris"}
    assert t.convert_arguments({"city": "Paris", "days": 2}) == {"city": "Paris", "days": 2}
    for bad, why in [
        ({}, "missing required property 'city'"),
        ({"city": 3}, r"\$.city: expected string"),
        ({"city": "P", "days": 0}, r"\$.days: must be >= 1"),
        ([1], "JSON object"),
    ]:
        with pytest.raises(InvalidToolArguments, match=why):
            t.check_arguments(bad)


def test_resolve_tool_choice() -> None:
    tools = as_tools([WEATHER, add])
    assert resolve_tool_choice("auto", tools) == ToolChoice("auto")
    assert resolve_tool_choice("none", tools) == ToolChoice("none")
    assert resolve_tool_choice("required", tools) == ToolChoice("required")
    assert resolve_tool_choice("add", tools) == ToolChoice("function", "add")
    assert resolve_tool_choice({"type": "function", "function": {"name": "add"}}, tools) == ToolChoice(
        "function", "add"
    )
    assert resolve_tool_choice("auto", ()) == ToolChoice("auto")
    assert ToolChoice("function", "add").allowed(tools) == (tools[1],)
    assert ToolChoice("none").allowed(tools) == ()
    assert ToolChoice("auto").allowed(tools) == tools
    assert ToolChoice("required").must_call and not ToolChoice("auto").must_call
    for bad in ["subtract", "", None, 3, {"type": "function"}, {"type": "x", "function": {"name": "add"}}]:
        with pytest.raises(InvalidTool):
            resolve_tool_choice(bad, tools)
    with pytest.raises(InvalidTool):
        resolve_tool_choice("required", ())


def tuples(p: tuple[int, int], q: tuple[str, ...] = ()) -> None:
    """Tuples."""


def test_tuple_parameters_are_plain_json() -> None:
    t = Tool.from_function(tuples)
    assert t.parameters["properties"] == {
        "p": {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [{"type": "integer"}, {"type": "integer"}]},
        "q": {"type": "array", "items": {"type": "string"}, "default": []},
    }
    assert t.convert_arguments({"p": [1, 2]}) == {"p": (1, 2), "q": ()}
    with pytest.raises(InvalidToolArguments):
        t.convert_arguments({"p": [1, 2, 3]})
