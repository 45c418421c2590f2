"""Keywords a grammar cannot enforce are refused, unless their value constrains nothing (then they are accepted, as
llama-server's json-schema-to-grammar accepts them, and the grammar is the one built without them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.errors import UnsupportedSchema
from runtime.grammar import json_schema_to_grammar, schema_for
from runtime.grammar.enforceable import check_enforceable
from runtime.tools.spec import Tool

ITEMS = {"type": "array", "items": {"type": "integer"}, "maxItems": 3}

# (keywords added to a schema, where) that constrain nothing
NEUTRAL: list[dict[str, Any]] = [
    {"uniqueItems": False},
    {"minContains": 0},
    {"maxContains": 2},
    {"not": False},
    {"then": {"type": "string"}},
    {"else": {"type": "string"}},
    {"if": {"type": "array"}},
    {"if": {"type": "array"}, "then": {}, "else": True},
    {"dependentRequired": {}},
    {"dependentRequired": {"a": []}},
    {"dependentSchemas": {"a": {}}},
    {"dependencies": {"a": True}},
    {"patternProperties": {}},
    {"propertyNames": {}},
    {"unevaluatedProperties": True},
    {"unevaluatedItems": {}},
]
# the same keywords with values that do constrain
BINDING: list[dict[str, Any]] = [
    {"uniqueItems": True},
    {"contains": {"type": "integer"}, "minContains": 2},
    {"contains": {"type": "integer"}},
    {"not": {"type": "string"}},
    {"not": True},
    {"if": {"type": "array"}, "then": {"maxItems": 1}},
    {"if": {"type": "array"}, "else": False},
    {"dependentRequired": {"a": ["b"]}},
    {"dependentSchemas": {"a": {"type": "object"}}},
    {"patternProperties": {"^x": {"type": "string"}}},
    {"propertyNames": {"maxLength": 2}},
    {"unevaluatedProperties": False},
    {"unevaluatedItems": False},
    {"multipleOf": 2},
    {"uniqueItems": 0},  # not the boolean false: refused rather than guessed
]


@pytest.mark.parametrize("extra", NEUTRAL, ids=lambda e: ",".join(f"{k}={e[k]!r}" for k in e))
def test_a_keyword_that_constrains_nothing_is_accepted(extra: dict[str, Any]) -> None:
    schema = {**ITEMS, **extra}
    check_enforceable(schema)
    check_enforceable({"type": "object", "properties": {"xs": schema}})
    got, _ = schema_for(schema)
    assert got == schema
    assert json_schema_to_grammar(schema) == json_schema_to_grammar(ITEMS)


@pytest.mark.parametrize("extra", BINDING, ids=lambda e: ",".join(f"{k}={e[k]!r}" for k in e))
def test_a_keyword_that_constrains_is_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedSchema, match="cannot be enforced by a grammar"):
        schema_for({**ITEMS, **extra})
    with pytest.raises(UnsupportedSchema, match=r"at #/properties/xs/items"):
        check_enforceable({"type": "object", "properties": {"xs": {"type": "array", "items": {**ITEMS, **extra}}}})


def test_multiple_of_one_on_integers_is_accepted() -> None:
    check_enforceable({"type": "integer", "multipleOf": 1})
    with pytest.raises(UnsupportedSchema):
        check_enforceable({"type": "number", "multipleOf": 1})


def test_tool_parameters_with_unique_items_false() -> None:
    params = {"type": "object", "properties": {"tags": {**ITEMS, "uniqueItems": False}}, "required": ["tags"]}
    spec = Tool.from_openai({"type": "function", "function": {"name": "tag", "parameters": params}})
    assert spec.name == "tag"


@pytest.mark.anyio
async def test_a_reply_under_unique_items_false(tiny_llama: Path) -> None:
    schema = {**ITEMS, "uniqueItems": False}
    async with Runtime.open(tiny_llama, n_ctx=512, n_threads=1) as rt:
        reply = await rt.complete([{"role": "user", "content": "hi"}], response_format=schema, max_tokens=40)
    assert isinstance(reply.parsed, list)
    assert all(isinstance(x, int) for x in reply.parsed)
