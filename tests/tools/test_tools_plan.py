"""ToolPlan: one request's tools checked up front, then rendering, grammar and parsing; tool result text."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runtime.errors import InvalidTool, ToolCallParseError, TurnstileError
from runtime.tools import GenericFormat, HermesFormat, Llama3Format, ToolChoice, ToolPlan, result_text


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_plan_without_a_grammar() -> None:
    plan = ToolPlan.build(HermesFormat(), [add], "none")
    assert plan.choice == ToolChoice("none") and plan.grammar is None and plan.stops == ()
    assert plan.tool("add") is plan.tools[0] and plan.tool("sub") is None
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert plan.parse(text).content == text  # with "none" nothing is a call
    rp = plan.render_plan([{"role": "user", "content": "hi"}])
    assert rp.tools == [plan.tools[0].openai()] and rp.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("choice", ["sub", "", 3, {"type": "function", "function": {"name": "sub"}}])
def test_plan_refuses_bad_input_first(choice: Any) -> None:
    with pytest.raises(InvalidTool):
        ToolPlan.build(HermesFormat(), [add], choice)
    with pytest.raises(InvalidTool):
        ToolPlan.build(HermesFormat(), [lambda a: a], "auto")


def test_plan_with_a_grammar() -> None:
    plan = ToolPlan.build(HermesFormat(), [add], "required", parallel=True)
    assert plan.parallel and plan.grammar is not None and not plan.grammar.lazy
    reply = plan.parse('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("add", {"a": 1, "b": 2})]
    with pytest.raises(ToolCallParseError):
        plan.parse("no call")
    llama = ToolPlan.build(Llama3Format(), [add], "auto", parallel=True)
    assert not llama.parallel and llama.stops == ("<|eom_id|>",)  # one call per reply in Llama 3.x
    generic = ToolPlan.build(GenericFormat(), [add], "add", parallel=True)
    assert generic.choice == ToolChoice("function", "add") and generic.grammar is not None
    assert not generic.parallel  # as llama-server: templates without tool calls get one call per reply
    with pytest.raises(dataclasses.FrozenInstanceError):
        generic.parallel = True  # type: ignore[misc]


def test_result_text() -> None:
    assert result_text("as is") == "as is"
    assert result_text({"a": [1, 2.5, None, True]}) == '{"a":[1,2.5,null,true]}'
    assert result_text(3) == "3"
    assert result_text(object()).startswith('"<object object at')


@pytest.mark.parametrize("fmt", [HermesFormat(), Llama3Format(), GenericFormat()])
def test_a_schema_the_converter_refuses_fails_at_build(fmt: Any) -> None:
    bad = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "kaboom"}}},
        },
    }
    with pytest.raises(TurnstileError) as info:
        ToolPlan.build(fmt, [bad], "auto")
    assert type(info.value).__name__ == "UnsupportedSchema" and isinstance(info.value, ValueError)
