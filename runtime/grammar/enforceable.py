"""Keywords a grammar cannot enforce. llama.cpp's converter ignores them silently (so a reply could break the
schema the caller wrote); turnstile refuses such a schema with `UnsupportedSchema` before anything is queued.

A keyword whose value constrains nothing (`"uniqueItems": false`, `"minContains": 0`, `"not": false`, an empty
`dependentRequired`, `"propertyNames": {}`, `"then"` without `"if"` …) is accepted, as llama-server accepts it:
ignoring it is then exactly what the schema means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.errors import UnsupportedSchema

__all__ = ["UNENFORCEABLE", "check_enforceable", "constrains_nothing"]

UNENFORCEABLE = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "patternProperties",
        "propertyNames",
        "uniqueItems",
        "multipleOf",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
_TRIVIAL_SCHEMAS: tuple[Any, ...] = (True, {})  # schemas every value matches


def _trivial(schema: Any) -> bool:
    return isinstance(schema, bool | Mapping) and any(schema == t and type(schema) is type(t) for t in _TRIVIAL_SCHEMAS)


def constrains_nothing(key: str, schema: Mapping[str, Any]) -> bool:
    """Whether `schema[key]` (an unenforceable keyword) is a value that allows every instance."""
    value = schema[key]
    if key == "uniqueItems":
        return value is False
    if key == "not":
        return value is False
    if key in ("then", "else"):
        return "if" not in schema or _trivial(value)
    if key == "if":  # without then/else an `if` decides nothing; with trivial branches neither
        return all(_trivial(schema.get(k, True)) for k in ("then", "else"))
    if key in ("minContains", "maxContains"):
        if "contains" not in schema:
            return True  # ignored without `contains` (JSON Schema 2020-12)
        return key == "minContains" and type(value) is int and value == 1
    if key == "contains":
        return False
    if key in ("dependentRequired", "dependentSchemas", "dependencies"):
        return isinstance(value, Mapping) and all(
            (isinstance(v, list) and not v) or _trivial(v) for v in value.values()
        )
    if key == "patternProperties":
        return isinstance(value, Mapping) and not value
    if key in ("propertyNames", "unevaluatedProperties", "unevaluatedItems"):
        return _trivial(value)
    if key == "multipleOf":  # 1 on an integer: every integer is a multiple of 1
        return type(value) is int and value == 1 and schema.get("type") == "integer"
    return False


_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "additionalItems")


def check_enforceable(schema: Any, path: str = "#") -> None:
    """Raise `UnsupportedSchema` naming the first keyword (and where) that no grammar can enforce."""
    if not isinstance(schema, Mapping):
        return
    for key in schema:
        if key in UNENFORCEABLE and not constrains_nothing(key, schema):
            raise UnsupportedSchema(f"keyword {key!r} at {path} cannot be enforced by a grammar")
    for key in _SUBSCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            for name, value in sub.items():
                check_enforceable(value, f"{path}/{key}/{name}")
    for key in _SUBSCHEMA_LISTS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, value in enumerate(sub):
                check_enforceable(value, f"{path}/{key}/{i}")
    for key in _SUBSCHEMAS:
        check_enforceable(schema.get(key), f"{path}/{key}")
