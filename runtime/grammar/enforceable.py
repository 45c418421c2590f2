"""Keywords a grammar cannot enforce. llama.cpp's converter ignores them silently (so a reply could break the
schema the caller wrote); turnstile refuses such a schema with `UnsupportedSchema` before anything is queued."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.errors import UnsupportedSchema

__all__ = ["UNENFORCEABLE", "check_enforceable"]

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
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "additionalItems")


def check_enforceable(schema: Any, path: str = "#") -> None:
    """Raise `UnsupportedSchema` naming the first keyword (and where) that no grammar can enforce."""
    if not isinstance(schema, Mapping):
        return
    for key in schema:
        if key in UNENFORCEABLE:
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
