"""A JSON schema read into typed nodes: the subset llama.cpp's grammar converter understands.

A port of llama.cpp's common/json-schema.cpp (`common_chat_schema_from_json`): the same keywords, the
same precedence between them ($ref, then oneOf/anyOf, then a type array, const, enum, type), the same
defaults ({"type": "object"} alone is any object) and the same errors, raised as `UnsupportedSchema`
with llama.cpp's message ("JSON schema error at #/path: reason"). Only local $refs ("#/...") are
followed, and only those the schema reaches.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from runtime.errors import UnsupportedSchema

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "AllOfNode",
    "AnyNode",
    "AnyOfNode",
    "ArrayNode",
    "BooleanNode",
    "ConstNode",
    "EnumNode",
    "IntegerNode",
    "Node",
    "NullNode",
    "NumberNode",
    "ObjectNode",
    "Property",
    "RefNode",
    "SchemaBuilder",
    "StringFormat",
    "StringNode",
    "TupleNode",
    "parse_leading_int",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class StringFormat(enum.Enum):
    """The string formats the converter has rules for."""

    NONE = "none"
    UUID = "uuid"  # uuid, uuid1 .. uuid5
    DATE = "date"
    TIME = "time"
    DATE_TIME = "date-time"


@dataclass(eq=False)
class AnyNode:
    """Any JSON value ({} or a schema with no keyword the converter knows)."""


@dataclass(eq=False)
class RefNode:
    """A local "$ref"; `target` is set once the whole schema is read (cycles are allowed)."""

    ref: str
    target: Node | None = None


@dataclass(eq=False)
class AnyOfNode:
    """oneOf / anyOf, or a "type" array expanded to one alternative per type."""

    children: list[Node]


@dataclass(eq=False)
class AllOfNode:
    """allOf: objects merged, enums intersected."""

    children: list[Node]


@dataclass(eq=False)
class ConstNode:
    """const: exactly this JSON value."""

    value: Any


@dataclass(eq=False)
class EnumNode:
    """enum: one of these JSON values."""

    values: list[Any]


@dataclass(eq=False)
class NullNode:
    """type null."""


@dataclass(eq=False)
class BooleanNode:
    """type boolean."""


@dataclass(eq=False)
class NumberNode:
    """type number (bounds are not enforced, as in llama.cpp)."""


@dataclass(eq=False)
class IntegerNode:
    """type integer; bounds inclusive, exclusive bounds folded in, INT64_MIN/INT64_MAX for none."""

    minimum: int = INT64_MIN
    maximum: int = INT64_MAX


@dataclass(eq=False)
class StringNode:
    """type string; `max_length` -1 for none; `pattern` empty when absent."""

    pattern: str = ""
    format: StringFormat = StringFormat.NONE
    min_length: int = 0
    max_length: int = -1


@dataclass(eq=False)
class ArrayNode:
    """type array with one item schema; `max_items` -1 for none."""

    items: Node
    min_items: int = 0
    max_items: int = -1


@dataclass(eq=False)
class TupleNode:
    """An array whose "items"/"prefixItems" is a list: exactly these items, in order."""

    items: list[Node]


@dataclass(eq=False)
class Property:
    """One entry of an object's "properties"."""

    name: str
    schema: Node
    required: bool = False


@dataclass(eq=False)
class ObjectNode:
    """type object; properties in schema order; `additional_properties` None when not allowed."""

    properties: list[Property] = field(default_factory=list)
    additional_properties: Node | None = None


Node = (
    AnyNode
    | RefNode
    | AnyOfNode
    | AllOfNode
    | ConstNode
    | EnumNode
    | NullNode
    | BooleanNode
    | NumberNode
    | IntegerNode
    | StringNode
    | ArrayNode
    | TupleNode
    | ObjectNode
)


def parse_leading_int(text: str) -> int | None:
    """C's strtol base 10 as std::stoi/stoull use it: spaces, a sign, digits, anything after ignored."""
    s = text.lstrip(" \t\n\r\f\v")
    end = 1 if s[:1] in ("+", "-") else 0
    start = end
    while end < len(s) and s[end] in "0123456789":
        end += 1
    return int(s[:end]) if end > start else None


def _is_json_int(value: Any) -> bool:
    """An integer as nlohmann keeps it (int64 or uint64); a larger one would have been parsed as a double."""
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value < 2**64


def _wrap(value: int, bits: int) -> int:
    half = 1 << (bits - 1)
    return ((value + half) % (1 << bits)) - half


class SchemaBuilder:
    """Reads schemas into nodes; `$ref`s are looked up in `root`, the document they belong to."""

    def __init__(self, root: Any) -> None:
        self._root = root
        self._refs: dict[str, Node | None] = {}
        self._pending: list[RefNode] = []

    def build(self, schema: Any = None, path: str = "#") -> Node:
        """The node of `schema` (default: the whole document), its $refs linked to their targets."""
        node = self.build_node(self._root if schema is None else schema, path)
        for ref in self._pending:
            ref.target = self._refs[ref.ref]
        return node

    @staticmethod
    def _fail(path: str, msg: str) -> NoReturn:
        raise UnsupportedSchema(f"JSON schema error at {path}: {msg}")

    def _count(self, schema: Mapping[str, Any], key: str, path: str, default: int) -> int:
        if key not in schema:
            return default
        value = schema[key]
        if not _is_json_int(value) or _wrap(value, 32) < 0:
            self._fail(path, key + " must be a non-negative integer")
        return _wrap(value, 32)

    def _bound(self, schema: Mapping[str, Any], key: str, path: str, round_up: bool) -> int:
        """A bound as int64; a fractional one is rounded inwards, towards the integers it admits."""
        value = schema[key]
        if _is_json_int(value):
            return int(_wrap(value, 64))
        if isinstance(value, bool) or not isinstance(value, int | float):
            self._fail(path, key + " must be a number")
        d = float(value)
        if not math.isfinite(d):
            return INT64_MIN
        r = math.ceil(d) if round_up else math.floor(d)
        return r if INT64_MIN <= r <= INT64_MAX else INT64_MIN  # x86 cvttsd2si gives INT64_MIN out of range

    def _format(self, schema: Mapping[str, Any], path: str) -> StringFormat:
        if "format" not in schema:
            return StringFormat.NONE
        value = schema["format"]
        if not isinstance(value, str):
            self._fail(path, "format must be a string")
        if value in ("date", "time", "date-time"):
            return StringFormat(value)
        if value == "uuid" or (len(value) == 5 and value.startswith("uuid") and value[4] in "12345"):
            return StringFormat.UUID
        return StringFormat.NONE

    def _resolve(self, ref: str, path: str) -> Any:
        target = self._root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = parse_leading_int(sel)
                if idx is None or not 0 <= idx < len(target):
                    self._fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                self._fail(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def _ref(self, value: Any, path: str) -> Node:
        if not isinstance(value, str):
            self._fail(path, "$ref must be a string")
        if not value.startswith("#/"):
            self._fail(path, f"unsupported $ref {value}, only references into the same document are supported")
        if value not in self._refs:
            self._refs[value] = None  # reserved first, so that a cycle back to this $ref stops here
            self._refs[value] = self.build_node(self._resolve(value, path), value)
        node = RefNode(value)
        self._pending.append(node)
        return node

    def _alternatives(self, alts: Any, path: str) -> list[Node]:
        if not isinstance(alts, list):
            self._fail(path, "must be an array of schemas")
        if not alts:
            self._fail(path, "must not be empty")
        return [self.build_node(alt, f"{path}/{i}") for i, alt in enumerate(alts)]

    def _object(self, schema: Mapping[str, Any], path: str) -> ObjectNode:
        node = ObjectNode()
        required: set[str] = set()
        if isinstance(schema.get("required"), list):
            required = {name for name in schema["required"] if isinstance(name, str)}
        if "properties" in schema:
            properties = schema["properties"]
            if not isinstance(properties, dict):
                self._fail(path, "properties must be an object")
            for name, prop in properties.items():
                node.properties.append(
                    Property(name, self.build_node(prop, f"{path}/properties/{name}"), name in required)
                )
        if "additionalProperties" in schema:
            additional = schema["additionalProperties"]
            if isinstance(additional, bool):
                node.additional_properties = AnyNode() if additional else None
            elif isinstance(additional, dict):
                node.additional_properties = self.build_node(additional, path + "/additionalProperties")
            else:
                self._fail(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            node.additional_properties = AnyNode()  # {"type": "object"} on its own accepts any object
        return node

    def _array(self, schema: Mapping[str, Any], path: str) -> Node:
        items: Node = AnyNode()
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"  # "items" wins when both are present
            value = schema[key]
            if isinstance(value, list):
                return TupleNode([self.build_node(item, f"{path}/{key}/{i}") for i, item in enumerate(value)])
            items = self.build_node(value, f"{path}/{key}")
        return ArrayNode(items, self._count(schema, "minItems", path, 0), self._count(schema, "maxItems", path, -1))

    def _string(self, schema: Mapping[str, Any], path: str) -> StringNode:
        node = StringNode()
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                self._fail(path, "pattern must be a string")
            node.pattern = schema["pattern"]
        node.format = self._format(schema, path)
        node.min_length = self._count(schema, "minLength", path, 0)
        node.max_length = self._count(schema, "maxLength", path, -1)
        return node

    def _integer(self, schema: Mapping[str, Any], path: str) -> IntegerNode:
        node = IntegerNode()
        if "minimum" in schema:
            node.minimum = self._bound(schema, "minimum", path, True)
        elif "exclusiveMinimum" in schema:
            node.minimum = _wrap(self._bound(schema, "exclusiveMinimum", path, False) + 1, 64)
        if "maximum" in schema:
            node.maximum = self._bound(schema, "maximum", path, False)
        elif "exclusiveMaximum" in schema:
            node.maximum = _wrap(self._bound(schema, "exclusiveMaximum", path, True) - 1, 64)
        return node

    def build_node(self, schema: Any, path: str) -> Node:
        """The node of one (sub)schema; `path` is where it sits, for error messages."""
        if not isinstance(schema, dict):
            self._fail(path, "schema must be an object")
        if "$ref" in schema:
            return self._ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return AnyOfNode(self._alternatives(schema[key], f"{path}/{key}"))
        kind = schema.get("type")
        if isinstance(kind, list):
            # {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}
            if not kind:
                self._fail(path, "type must not be empty")
            return AnyOfNode([self.build_node({**schema, "type": t}, f"{path}/type/{i}") for i, t in enumerate(kind)])
        if "const" in schema:
            return ConstNode(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                self._fail(path, "enum must be a non-empty array")
            return EnumNode(list(values))
        if kind is not None and not isinstance(kind, str):
            self._fail(path, "type must be a string or an array of strings")
        additional = schema.get("additionalProperties")
        has_properties = "properties" in schema or (
            "additionalProperties" in schema and not (isinstance(additional, bool) and additional)
        )
        if not kind:
            # without a type the structural keywords decide, in the converter's order
            if has_properties:
                return self._object(schema, path)
            if "allOf" in schema:
                return AllOfNode(self._alternatives(schema["allOf"], path + "/allOf"))
            if "items" in schema or "prefixItems" in schema:
                return self._array(schema, path)
            string_keys = "pattern" in schema or "minLength" in schema or "maxLength" in schema
            if string_keys or self._format(schema, path) is not StringFormat.NONE:
                return self._string(schema, path)
            return AnyNode()
        if kind == "object":
            if not has_properties and "allOf" in schema:
                return AllOfNode(self._alternatives(schema["allOf"], path + "/allOf"))
            return self._object(schema, path)
        if kind == "string":
            if "allOf" in schema:
                return AllOfNode(self._alternatives(schema["allOf"], path + "/allOf"))
            return self._string(schema, path)
        if kind == "array":
            return self._array(schema, path)
        if kind == "integer":
            return self._integer(schema, path)
        simple: dict[str, Node] = {"number": NumberNode(), "boolean": BooleanNode(), "null": NullNode()}
        if kind in simple:
            return simple[kind]
        self._fail(path, "unrecognized type " + kind)
