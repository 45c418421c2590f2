"""Check a decoded JSON value against a schema, with the grammar's meaning of the schema.

The checks are what the GBNF built from the same schema enforces (so a grammar-constrained reply
always passes): llama.cpp's reading of the keywords (schema_nodes), allOf as merged objects or an
enum intersection, patterns only where the converter could translate them, no extra properties
unless additionalProperties allows them. Property order and number spelling are not checked.
A mismatch raises `ReplyMismatch` naming the JSON path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runtime.errors import InvalidPattern, ReplyMismatch, UnsupportedPattern
from runtime.grammar.gbnf import json_dump
from runtime.grammar.pattern import pattern_to_rule
from runtime.grammar.schema_nodes import (
    INT64_MAX,
    INT64_MIN,
    AllOfNode,
    AnyNode,
    AnyOfNode,
    ArrayNode,
    BooleanNode,
    ConstNode,
    EnumNode,
    IntegerNode,
    Node,
    NullNode,
    NumberNode,
    ObjectNode,
    Property,
    RefNode,
    SchemaBuilder,
    StringFormat,
    StringNode,
    TupleNode,
)

__all__ = ["check_value", "validate"]

_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{3})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_FORMATS = {
    StringFormat.DATE: re.compile(_DATE),
    StringFormat.TIME: re.compile(_TIME),
    StringFormat.DATE_TIME: re.compile(_DATE + "T" + _TIME),
    StringFormat.UUID: re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
}


def validate(value: Any, schema: Mapping[str, Any]) -> None:
    """Raise `ReplyMismatch` unless `value` (decoded JSON) is in the language of `schema`'s grammar.

    Raises `UnsupportedSchema` for a schema llama.cpp rejects.
    """
    check_value(value, SchemaBuilder(schema).build())


def check_value(value: Any, node: Node, path: str = "$") -> None:
    """Raise `ReplyMismatch` unless `value` matches the schema node (see module docstring)."""
    _check(value, node, path)


def _fail(path: str, why: str) -> ReplyMismatch:
    return ReplyMismatch(f"reply does not match the schema at {path}: {why}")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _matches(value: Any, node: Node, path: str) -> bool:
    try:
        _check(value, node, path)
    except ReplyMismatch:
        return False
    return True


def _check(value: Any, node: Node, path: str) -> None:
    kind = _type_name(value)
    if isinstance(node, AnyNode):
        return
    if isinstance(node, RefNode):
        if node.target is not None:
            _check(value, node.target, path)
        return
    if isinstance(node, AnyOfNode):
        if not any(_matches(value, alt, path) for alt in node.children):
            raise _fail(path, f"matches none of {len(node.children)} alternatives")
        return
    if isinstance(node, AllOfNode):
        _check_all_of(value, node, path)
        return
    if isinstance(node, ConstNode):
        if json_dump(value) != json_dump(node.value):
            raise _fail(path, f"expected {json_dump(node.value)}")
        return
    if isinstance(node, EnumNode):
        if json_dump(value) not in {json_dump(v) for v in node.values}:
            raise _fail(path, "not one of the enum values")
        return
    expected = {
        NullNode: ("null",),
        BooleanNode: ("boolean",),
        NumberNode: ("integer", "number"),
        IntegerNode: ("integer",),
        StringNode: ("string",),
        ArrayNode: ("array",),
        TupleNode: ("array",),
        ObjectNode: ("object",),
    }[type(node)]
    if kind not in expected:
        raise _fail(path, f"expected {expected[-1]}, got {kind}")
    if isinstance(node, IntegerNode):
        if node.minimum != INT64_MIN and value < node.minimum:
            raise _fail(path, f"{value} < minimum {node.minimum}")
        if node.maximum != INT64_MAX and value > node.maximum:
            raise _fail(path, f"{value} > maximum {node.maximum}")
    elif isinstance(node, StringNode):
        _check_string(value, node, path)
    elif isinstance(node, TupleNode):
        if len(value) != len(node.items):
            raise _fail(path, f"expected {len(node.items)} items, got {len(value)}")
        for i, (item, item_node) in enumerate(zip(value, node.items, strict=True)):
            _check(item, item_node, f"{path}[{i}]")
    elif isinstance(node, ArrayNode):
        if len(value) < node.min_items or (node.max_items >= 0 and len(value) > node.max_items):
            raise _fail(path, f"{len(value)} items, outside [{node.min_items}, {node.max_items}]")
        for i, item in enumerate(value):
            _check(item, node.items, f"{path}[{i}]")
    elif isinstance(node, ObjectNode):
        _check_object(value, node.properties, node.additional_properties, path)


def _check_string(value: str, node: StringNode, path: str) -> None:
    if node.pattern:
        try:  # only what the grammar enforces: a pattern it could not translate accepts any string
            pattern_to_rule(node.pattern, "p", lambda name, body: name)
        except (UnsupportedPattern, InvalidPattern):
            return
        try:
            matched = re.fullmatch(node.pattern[1:-1], value)
        except re.error:
            return
        if matched is None:
            raise _fail(path, f"does not match the pattern {node.pattern}")
        return
    if node.format is not StringFormat.NONE:
        if _FORMATS[node.format].fullmatch(value) is None:
            raise _fail(path, f"not a {node.format.value} string")
        return
    if len(value) < node.min_length or (node.max_length >= 0 and len(value) > node.max_length):
        raise _fail(path, f"length {len(value)} outside [{node.min_length}, {node.max_length}]")


def _check_object(value: dict[str, Any], properties: list[Property], additional: Node | None, path: str) -> None:
    known: dict[str, Node] = {}
    for prop in properties:
        known[prop.name] = prop.schema
        if prop.required and prop.name not in value:
            raise _fail(path, f"missing required property {prop.name!r}")
    for key, item in value.items():
        if key in known:
            _check(item, known[key], f"{path}.{key}")
        elif additional is not None:
            _check(item, additional, f"{path}.{key}")
        else:
            raise _fail(path, f"unexpected property {key!r}")


def _check_all_of(value: Any, node: AllOfNode, path: str) -> None:
    """allOf as the grammar reads it: the enum values all parts share, else the merged objects."""
    properties: list[Property] = []
    counts: dict[str, int] = {}

    def add(comp: Node, required: bool) -> None:
        if isinstance(comp, RefNode):
            if comp.target is not None:
                add(comp.target, required)
        elif isinstance(comp, ObjectNode):
            properties.extend(Property(p.name, p.schema, required) for p in comp.properties)
        elif isinstance(comp, EnumNode):
            for v in comp.values:
                counts[json_dump(v)] = counts.get(json_dump(v), 0) + 1

    for child in node.children:
        if isinstance(child, AnyOfNode):
            for alt in child.children:
                add(alt, False)
        else:
            add(child, True)
    common = {v for v, n in counts.items() if n == len(node.children)}
    if common:
        if json_dump(value) not in common:
            raise _fail(path, "not one of the values every allOf part allows")
        return
    if not isinstance(value, dict):
        raise _fail(path, f"expected object, got {_type_name(value)}")
    required = {p.name for p in properties if p.required}
    merged = [Property(p.name, p.schema, p.name in required) for p in properties]
    _check_object(value, merged, None, path)
