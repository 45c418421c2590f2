"""The Jinja environment chat templates run in: jinja2's immutable sandbox set up the way llama.cpp's own
Jinja engine (common/jinja) behaves, so a template renders here exactly as llama-server renders it.

What differs from plain jinja2, and why (each is llama.cpp's behaviour):
- `trim_blocks` and `lstrip_blocks` on, one trailing newline of the source dropped, `loopcontrols`, `do` and
  transformers' `{% generation %}`;
- an undefined value can be chained (`a.b.c` of an undefined `a` is undefined, not an error);
- `tojson` writes `", "` / `": "` separators, keeps non-ASCII characters, never HTML-escapes and prints
  floats as C++ streams do (`%g`); `raise_exception(msg)` raises `TemplateRaised`, `strftime_now(fmt)` is
  the local time;
- lists the template builds itself may be appended to and popped from (Kimi K2 keeps a queue of ids).

Compiling is cached per source (`compile_template`), so a template is parsed once per process.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from runtime.errors import TemplateRaised

__all__ = ["TemplateRaised", "compile_template", "make_environment", "tojson"]


def _raise_exception(message: object) -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt, time.localtime())


def _plain(value: Any) -> str:
    return str(value)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _json_string(s: str, ensure_ascii: bool) -> str:
    out = ['"']
    for c in s:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif ord(c) < 0x20:
            out.append(f"\\u{ord(c):04x}")
        elif ensure_ascii and ord(c) > 0x7F:
            out.append(json.dumps(c))  # \uXXXX, with a surrogate pair above the BMP
            out[-1] = out[-1][1:-1]
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _float(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        return "null"
    return f"{x:g}"


def _dump(v: Any, lvl: int, indent: int, isep: str, ksep: str, ascii_: bool) -> str:
    pad = " " * (lvl * indent) if indent > 0 else ""
    step = " " * indent if indent > 0 else ""
    nl = "\n" if indent >= 0 else ""
    if v is None or isinstance(v, jinja2.Undefined):
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, str):
        return _json_string(str.__str__(v), ascii_)
    if isinstance(v, (list, tuple)):
        if not v:
            return "[]"
        items = [pad + step + _dump(x, lvl + 1, indent, isep, ksep, ascii_) for x in v]
        return "[" + nl + (isep + nl).join(items) + nl + pad + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        pairs = [
            pad + step + _json_string(str(k), ascii_) + ksep + _dump(x, lvl + 1, indent, isep, ksep, ascii_)
            for k, x in dict.items(v)
        ]
        return "{" + nl + (isep + nl).join(pairs) + nl + pad + "}"
    if isinstance(v, Iterable) and not isinstance(v, (bytes, jinja2.Undefined)):
        return _dump(list(v), lvl, indent, isep, ksep, ascii_)  # a generator (`map`, `select`): a list
    return "null"


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """JSON text of a value, formatted as llama.cpp's Jinja `tojson` formats it."""
    if sort_keys:
        raise TemplateRaised("tojson sort_keys=true not implemented")
    ind = indent if isinstance(indent, int) and not isinstance(indent, bool) else -1
    seps = list(separators) if isinstance(separators, (list, tuple)) else []
    isep = str(seps[0]) if seps else (", " if ind < 0 else ",")
    ksep = str(seps[1]) if len(seps) > 1 else ": "
    return _dump(value, 0, ind, isep, ksep, bool(ensure_ascii))


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` (transformers' marker of assistant text): renders its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2 declares it so

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class LenientUndefined(jinja2.ChainableUndefined):
    """llama.cpp's undefined: chains, prints as "", and adds to a string as "" (`"a" + undefined` is "a")."""

    def __add__(self, other: Any) -> Any:
        return other if isinstance(other, str) else jinja2.ChainableUndefined.__add__(self, other)

    def __radd__(self, other: Any) -> Any:
        return other if isinstance(other, str) else jinja2.ChainableUndefined.__radd__(self, other)


_MUTABLE_LIST_METHODS = frozenset({"append", "pop"})


class ChatSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox, except that lists may be appended to and popped from (see the module)."""

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in _MUTABLE_LIST_METHODS:
            return True
        return super().is_safe_attribute(obj, attr, value)


def make_environment(cls: type[ChatSandbox] = ChatSandbox, **filters: Callable[..., Any]) -> ChatSandbox:
    """A new environment with llama.cpp's settings, filters and globals (`filters` override them)."""
    env = cls(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=LenientUndefined,
        extensions=[jinja2.ext.loopcontrols, jinja2.ext.do, GenerationTag],
        autoescape=False,
    )
    env.filters["tojson"] = tojson
    env.filters["safe"] = _plain  # llama.cpp has no markup: `"a"|safe + x` is plain concatenation
    env.filters.update(filters)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = make_environment()


@functools.lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template of `source` (cached); raises jinja2.TemplateSyntaxError when it does not parse."""
    return _ENV.from_string(source)
