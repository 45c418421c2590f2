"""The small JSON-schema validator used for the arguments of tools given as dicts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from runtime.tools.validate import problem

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5, "pattern": "^[a-z]+$"},
        "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
        "score": {"type": "number", "maximum": 1},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
        "kind": {"const": "person"},
        "maybe": {"type": ["string", "null"]},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
        "pt": {"$ref": "#/$defs/Point"},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]},
        "both": {"allOf": [{"type": "integer"}, {"minimum": 3}]},
    },
    "required": ["name"],
    "additionalProperties": False,
    "$defs": {
        "Point": {
            "type": "object",
            "properties": {"x": {"type": "number"}},
            "required": ["x"],
            "additionalProperties": {"type": "integer"},
            "maxProperties": 2,
        }
    },
}

GOOD: dict[str, Any] = {
    "name": "ann",
    "age": 3,
    "score": 0.5,
    "tags": ["a"],
    "kind": "person",
    "maybe": None,
    "pair": ["x", True],
    "pt": {"x": 1.5, "extra": 2},
    "either": "z",
    "both": 4,
}


def test_accepts_a_valid_value() -> None:
    assert problem(GOOD, SCHEMA) is None
    assert problem({"name": "a", "age": 3.0}, SCHEMA) is None  # 3.0 is an integer in JSON
    assert problem({"x": [1, {"y": None}]}, {}) is None
    assert problem(1, True) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"name": None}, r"\$.name: expected string, got null"),
        ({"name": ""}, "shorter than 1"),
        ({"name": "abcdef"}, "longer than 5"),
        ({"name": "AB"}, "does not match pattern"),
        ({"age": -1}, r"\$.age: must be >= 0"),
        ({"age": 150}, "must be < 150"),
        ({"age": True}, "expected integer, got boolean"),
        ({"age": 1.5}, "expected integer, got number"),
        ({"score": 2}, "must be <= 1"),
        ({"tags": []}, "fewer than 1 items"),
        ({"tags": ["a", "b", "a"]}, "more than 2 items"),
        ({"tags": ["c"]}, r"\$.tags\[0\]: must be one of"),
        ({"kind": "cat"}, "must be 'person'"),
        ({"maybe": 3}, "expected string or null"),
        ({"pair": ["x", True, 1]}, r"\$.pair\[2\]: no value is allowed"),
        ({"pair": ["x", "y"]}, "expected boolean"),
        ({"pt": {}}, "missing required property 'x'"),
        ({"pt": {"x": 1, "e": "s"}}, r"\$.pt.e: expected integer"),
        ({"pt": {"x": 1, "e": 1, "f": 2}}, "more than 2 properties"),
        ({"either": "zz"}, "matches none of anyOf"),
        ({"both": 2}, "must be >= 3"),
        ({"other": 1}, "unexpected property 'other'"),
    ],
)
def test_reports_the_first_problem(change: dict[str, Any], why: str) -> None:
    bad = problem({**GOOD, **change}, SCHEMA)
    assert bad is not None
    assert re.search(why, bad), bad


def test_missing_required_and_bad_refs() -> None:
    assert problem({}, SCHEMA) == "$: missing required property 'name'"
    assert problem([], SCHEMA) == "$: expected object, got array"
    assert problem(1, {"$ref": "#/$defs/Nope"}) == "$: cannot resolve $ref '#/$defs/Nope'"
    assert problem(1, {"$ref": "https://example.com/s.json"}) is not None
    assert problem(1, False) == "$: no value is allowed here"
    assert problem("x", {"pattern": "("}) is not None
    assert problem(True, {"enum": [1]}) is not None and problem(1, {"enum": [True]}) is not None
    assert problem(1, {"enum": [1.0]}) is None
