"""A small JSON Schema validator for tool arguments: the subset llama.cpp's grammar converter understands.

Checked: `type` (one or a list), `enum`, `const`, `properties`, `required`, `additionalProperties`,
`minProperties`/`maxProperties`, `items` and `prefixItems`, `minItems`/`maxItems`, `minLength`/`maxLength`,
`pattern`, `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, `anyOf`/`oneOf`/`allOf`, and local
`$ref`s (`#/$defs/...`, `#/definitions/...`). Annotations (`description`, `title`, `default`, `format`, ...)
are ignored. `problem(value, schema)` returns the first violation as text, or None.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["problem"]

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list | tuple),
}


def problem(value: Any, schema: Any, root: Any = None, path: str = "$") -> str | None:
    """The first way `value` breaks `schema` (a JSON-schema dict or bool), as `path: reason`, or None."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return None
    if schema is False:
        return f"{path}: no value is allowed here"
    if not isinstance(schema, Mapping):
        return f"{path}: the schema is not an object"
    if "$ref" in schema:
        target = _resolve(root, schema["$ref"])
        if target is None:
            return f"{path}: cannot resolve $ref {schema['$ref']!r}"
        return problem(value, target, root, path)
    for check in (_check_type, _check_choice, _check_combinators, _check_number, _check_string):
        bad = check(value, schema, root, path)
        if bad is not None:
            return bad
    if isinstance(value, dict):
        return _check_object(value, schema, root, path)
    if isinstance(value, list | tuple):
        return _check_array(list(value), schema, root, path)
    return None


def _resolve(root: Any, ref: object) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _check_type(value: Any, schema: Mapping[str, Any], _root: Any, path: str) -> str | None:
    want = schema.get("type")
    if want is None:
        return None
    names = [want] if isinstance(want, str) else list(want)
    for name in names:
        test = _TYPES.get(name)
        if test is not None and test(value):
            return None
    return f"{path}: expected {' or '.join(map(str, names))}, got {_kind(value)}"


def _kind(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(type(a) is type(b) or (_TYPES["number"](a) and _TYPES["number"](b))) and a == b


def _check_choice(value: Any, schema: Mapping[str, Any], _root: Any, path: str) -> str | None:
    if "const" in schema and not _same(value, schema["const"]):
        return f"{path}: must be {schema['const']!r}"
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        return f"{path}: must be one of {list(schema['enum'])!r}"
    return None


def _check_combinators(value: Any, schema: Mapping[str, Any], root: Any, path: str) -> str | None:
    for sub in schema.get("allOf", ()):
        bad = problem(value, sub, root, path)
        if bad is not None:
            return bad
    for key in ("anyOf", "oneOf"):
        if key in schema:
            reasons = [problem(value, sub, root, path) for sub in schema[key]]
            if all(r is not None for r in reasons):
                return f"{path}: matches none of {key} ({'; '.join(str(r) for r in reasons)})"
    return None


def _check_number(value: Any, schema: Mapping[str, Any], _root: Any, path: str) -> str | None:
    if not _TYPES["number"](value):
        return None
    for key, ok, sign in _LIMITS:
        bound = schema.get(key)
        if _TYPES["number"](bound) and not ok(value, bound):
            return f"{path}: must be {sign} {bound}"
    return None


_LIMITS: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
    ("minimum", operator.ge, ">="),
    ("maximum", operator.le, "<="),
    ("exclusiveMinimum", operator.gt, ">"),
    ("exclusiveMaximum", operator.lt, "<"),
)


def _check_string(value: Any, schema: Mapping[str, Any], _root: Any, path: str) -> str | None:
    if not isinstance(value, str):
        return None
    if "minLength" in schema and len(value) < schema["minLength"]:
        return f"{path}: shorter than {schema['minLength']} characters"
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        return f"{path}: longer than {schema['maxLength']} characters"
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            if re.search(pattern, value) is None:
                return f"{path}: does not match pattern {pattern!r}"
        except re.error:
            return f"{path}: the schema's pattern {pattern!r} is not a valid regular expression"
    return None


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], root: Any, path: str) -> str | None:
    props: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            return f"{path}: missing required property {name!r}"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in props:
            bad = problem(item, props[name], root, f"{path}.{name}")
        elif extra is False:
            bad = f"{path}: unexpected property {name!r}"
        else:
            bad = problem(item, extra, root, f"{path}.{name}")
        if bad is not None:
            return bad
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        return f"{path}: fewer than {schema['minProperties']} properties"
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        return f"{path}: more than {schema['maxProperties']} properties"
    return None


def _check_array(value: list[Any], schema: Mapping[str, Any], root: Any, path: str) -> str | None:
    if "minItems" in schema and len(value) < schema["minItems"]:
        return f"{path}: fewer than {schema['minItems']} items"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{path}: more than {schema['maxItems']} items"
    prefix = schema.get("prefixItems", [])
    items = schema.get("items", True)
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        bad = problem(item, sub, root, f"{path}[{i}]")
        if bad is not None:
            return bad
    return None
