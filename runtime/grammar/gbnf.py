"""GBNF building blocks shared by the schema converter: primitive rules, literals, repetitions.

The texts are llama.cpp's (common/json-schema-to-grammar.cpp), byte for byte, so grammars built here
equal the ones llama-server builds. `json_dump` writes a value as nlohmann::json's `dump()` does
(compact, UTF-8 kept, numbers in nlohmann's shortest form), which is how llama.cpp spells constants.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from runtime.errors import UnsupportedSchema

__all__ = [
    "INT_MAX",
    "PRIMITIVE_RULES",
    "SPACE_RULE",
    "STRING_FORMAT_RULES",
    "BuiltinRule",
    "build_repetition",
    "format_literal",
    "gbnf_escape_length",
    "is_reserved_name",
    "json_dump",
    "sanitize_rule_name",
]

INT_MAX = 2**31 - 1  # std::numeric_limits<int>::max(): "no upper bound" for repetitions

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'


@dataclass(frozen=True)
class BuiltinRule:
    """A primitive rule's body and the primitive rules it refers to."""

    content: str
    deps: tuple[str, ...] = ()


PRIMITIVE_RULES: dict[str, BuiltinRule] = {
    "boolean": BuiltinRule('("true" | "false")'),
    "decimal-part": BuiltinRule("[0-9]{1,16}"),
    "integral-part": BuiltinRule("[0] | [1-9] [0-9]{0,15}"),
    "number": BuiltinRule(
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?', ("integral-part", "decimal-part")
    ),
    "integer": BuiltinRule('("-"? integral-part)', ("integral-part",)),
    "value": BuiltinRule(
        "object | array | string | number | boolean | null", ("object", "array", "string", "number", "boolean", "null")
    ),
    "object": BuiltinRule(
        '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"', ("string", "value")
    ),
    "array": BuiltinRule('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": BuiltinRule(
        '"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\""'
    ),
    "char": BuiltinRule('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})'),
    "string": BuiltinRule('"\\"" char* "\\""', ("char",)),
    "null": BuiltinRule('"null"'),
}

STRING_FORMAT_RULES: dict[str, BuiltinRule] = {
    "date": BuiltinRule('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )'),
    "time": BuiltinRule(
        '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )?'
        ' ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )'
    ),
    "date-time": BuiltinRule('date "T" time', ("date", "time")),
    "date-string": BuiltinRule('"\\"" date "\\""', ("date",)),
    "time-string": BuiltinRule('"\\"" time "\\""', ("time",)),
    "date-time-string": BuiltinRule('"\\"" date-time "\\""', ("date-time",)),
}

_RESERVED = frozenset({"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES})
_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')
_HEX = frozenset("0123456789abcdefABCDEF")


def is_reserved_name(name: str) -> bool:
    """Whether a schema name would clash with a primitive rule (visit then appends "-")."""
    return name in _RESERVED


def sanitize_rule_name(name: str) -> str:
    """Replace each run of characters GBNF names cannot hold with one "-"."""
    return _INVALID_RULE_CHARS.sub("-", name)


def format_literal(literal: str) -> str:
    """A GBNF string literal for `literal` (escapes CR, LF, quote and backslash)."""
    return '"' + _LITERAL_ESCAPE_RE.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], literal) + '"'


def build_repetition(item_rule: str, min_items: int, max_items: int, separator_rule: str = "") -> str:
    """`item_rule` repeated min..max times (`max_items == INT_MAX`: unbounded), optionally separated."""
    has_max = max_items != INT_MAX
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return item_rule + "?"
    if not separator_rule:
        if min_items == 1 and not has_max:
            return item_rule + "+"
        if min_items == 0 and not has_max:
            return item_rule + "*"
        return item_rule + "{" + str(min_items) + "," + (str(max_items) if has_max else "") + "}"
    rest = build_repetition(
        "(" + separator_rule + " " + item_rule + ")",
        0 if min_items == 0 else min_items - 1,
        max_items - 1 if has_max else max_items,
    )
    result = item_rule + " " + rest
    return "(" + result + ")?" if min_items == 0 else result


def gbnf_escape_length(pattern: str, pos: int) -> int:
    """Length of the GBNF escape at `pattern[pos]` (a backslash), or 0 when GBNF has no such escape."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    kind = pattern[pos + 1]
    if kind in 'trn\\"[]-':
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(kind, 0)
    if n_hex == 0 or pos + 2 + n_hex > len(pattern):
        return 0
    if any(h not in _HEX for h in pattern[pos + 2 : pos + 2 + n_hex]):
        return 0
    return 2 + n_hex


# -- nlohmann::json dump() -------------------------------------------------------------------------------------

_STRING_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _dump_string(text: str) -> str:
    out = ['"']
    for ch in text:
        esc = _STRING_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _dump_double(value: float) -> str:
    """nlohmann's `to_chars`: shortest digits, fixed notation for exponents in (-4, 15], else d.ddde+XX."""
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    assert isinstance(exponent, int)
    exponent += len("".join(map(str, digit_tuple))) - len(digits)
    k = len(digits)
    n = k + exponent
    if k <= n <= 15:
        return sign + digits + "0" * (n - k) + ".0"
    if 0 < n <= 15:
        return sign + digits[:n] + "." + digits[n:]
    if -4 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    e = n - 1
    return sign + mantissa + "e" + ("-" if e < 0 else "+") + f"{abs(e):02d}"


def json_dump(value: Any) -> str:
    """`value` as nlohmann::ordered_json's `dump()` writes it (what llama.cpp puts in const/enum literals)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        # nlohmann keeps int64 and uint64; a larger integer in the request text is parsed as a double
        return str(value) if -(2**63) <= value < 2**64 else _dump_double(float(value))
    if isinstance(value, float):
        return _dump_double(value)
    if isinstance(value, str):
        return _dump_string(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(json_dump(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(_dump_string(str(k)) + ":" + json_dump(v) for k, v in value.items()) + "}"
    raise UnsupportedSchema(f"not a JSON value: {type(value).__name__}")
