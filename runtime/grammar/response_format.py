"""Response formats: what a caller asks a reply to be, as a JSON schema and a parser for the reply.

`schema_for(fmt)` accepts a msgspec Struct, dataclass or TypedDict type (its schema from
`msgspec.json.schema`, tuples as "prefixItems" only; the reply decoded into the type), a JSON-schema
dict (the reply decoded and checked with the grammar's meaning of the schema), "json" (any JSON
object: the schema llama-server uses for `{"type": "json_object"}`), or None / "text" (no schema,
the text as it is). Everything is checked before it is returned: a schema llama.cpp would reject
raises `UnsupportedSchema` here, not when the request runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, is_typeddict

import msgspec

from runtime.errors import ReplyMismatch, ResponseFormatError, UnsupportedSchema
from runtime.grammar.chat import reply_content
from runtime.grammar.enforceable import check_enforceable
from runtime.grammar.json_schema import json_schema_to_grammar
from runtime.grammar.schema_nodes import SchemaBuilder
from runtime.grammar.validate import check_value

__all__ = ["JSON_OBJECT_SCHEMA", "ResponseFormat", "schema_for"]

# llama-server: an absent or empty schema (response_format {"type": "json_object"}) means any object
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}

ResponseFormat = type | Mapping[str, Any] | str | None


def _is_type_format(fmt: object) -> bool:
    if not isinstance(fmt, type):
        return False
    return issubclass(fmt, msgspec.Struct) or dataclasses.is_dataclass(fmt) or is_typeddict(fmt)


def _decode(text: str) -> Any:
    try:
        return msgspec.json.decode(reply_content(text))
    except msgspec.DecodeError as err:
        raise ReplyMismatch(f"reply is not JSON: {err}") from None


def _schema_parser(schema: Mapping[str, Any]) -> Callable[[str], Any]:
    node = SchemaBuilder(schema).build()

    def parse(text: str) -> Any:
        value = _decode(text)
        check_value(value, node)
        return value

    return parse


def _type_parser(fmt: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return msgspec.json.decode(reply_content(text), type=fmt)
        except msgspec.ValidationError as err:
            raise ReplyMismatch(f"reply does not match {fmt.__name__}: {err}") from None
        except msgspec.DecodeError as err:
            raise ReplyMismatch(f"reply is not JSON: {err}") from None

    return parse


def _closed_tuples(schema: Any) -> Any:
    """`schema` without msgspec's `"items": false` beside "prefixItems" (a fixed-length tuple).

    llama.cpp reads "items" before "prefixItems" and rejects `false` there; without it the tuple is
    read from "prefixItems", which has the same meaning (exactly those items).
    """
    if isinstance(schema, dict):
        return {
            k: _closed_tuples(v)
            for k, v in schema.items()
            if not (k == "items" and v is False and isinstance(schema.get("prefixItems"), list))
        }
    if isinstance(schema, list):
        return [_closed_tuples(v) for v in schema]
    return schema


def _text(text: str) -> str:
    return text


def schema_for(fmt: ResponseFormat) -> tuple[dict[str, Any] | None, Callable[[str], Any]]:
    """The JSON schema to constrain a reply to (None: no constraint) and the parser of the reply's text.

    The parser takes the reply text (a ```json fence and surrounding whitespace, which llama-server's
    grammar allows, are removed first) and returns the decoded value, raising `ReplyMismatch` when it
    is not JSON or does not match. Raises `ResponseFormatError` for a `fmt` of another kind and
    `UnsupportedSchema` for a schema llama.cpp cannot turn into a grammar.
    """
    if fmt is None or fmt == "text":
        return None, _text
    if fmt == "json":
        return dict(JSON_OBJECT_SCHEMA), _schema_parser(JSON_OBJECT_SCHEMA)
    if isinstance(fmt, str):
        raise ResponseFormatError(f'unknown response format {fmt!r} (expected "json", "text", a type or a schema)')
    if isinstance(fmt, Mapping):
        schema = dict(fmt)
        check_enforceable(schema)
        json_schema_to_grammar(schema)  # raises UnsupportedSchema now rather than when the request runs
        return schema, _schema_parser(schema)
    if _is_type_format(fmt):
        assert isinstance(fmt, type)
        try:
            schema = _closed_tuples(msgspec.json.schema(fmt))
        except (TypeError, ValueError) as err:
            raise ResponseFormatError(f"cannot make a JSON schema for {fmt.__name__}: {err}") from None
        try:
            json_schema_to_grammar(schema)
        except UnsupportedSchema as err:
            raise UnsupportedSchema(f"{fmt.__name__}: {err.reason}") from None
        return schema, _type_parser(fmt)
    raise ResponseFormatError(
        f"a response format is a msgspec Struct, dataclass or TypedDict type, a JSON schema dict, "
        f'"json" or "text"; got {fmt!r}'
    )
