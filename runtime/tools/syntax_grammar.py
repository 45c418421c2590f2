"""The GBNF for calls in a family's `ToolSyntax`, composed with the JSON-schema converter.

Rules: `tool-call` is one call of any allowed tool (`NAME-call`, per tool), `root` the calls part (section
opener, one call or, with `parallel`, several, section closer). Arguments are the tool's JSON schema; in
the XML shapes each parameter is a tagged value: a string parameter is any text up to its closer (the
closer cannot occur inside it), any other is JSON of its schema; the parameters come in schema order,
the required ones always, the others optionally (llama-server's XML grammars do the same).

Triggers (`auto`): the opener as a trigger word; a template with a reasoning block gets a trigger pattern
instead, which matches only once the block is closed or when no block was opened, so a call written in
the reasoning never starts the grammar. `required` / a name: not lazy; with a reasoning block the grammar
first allows an optional reasoning block (any text up to and including the closer), then the calls.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from runtime.grammar.chat import reasoning_rules
from runtime.tools.families import ToolSyntax
from runtime.tools.grammar import GrammarBuilder, ToolGrammar, gbnf_literal
from runtime.tools.scan import string_typed
from runtime.tools.spec import Tool

__all__ = ["syntax_grammar", "trigger_pattern"]


def _lit(text: str) -> str:
    return gbnf_literal(text) if text else ""


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _json_call(b: GrammarBuilder, s: ToolSyntax, tool: Tool) -> str:
    params = b.document(tool.parameters)
    props: dict[str, Any] = {}
    required: list[str] = []
    id_schema: dict[str, Any] = {"type": "string", **({"pattern": s.id_pattern} if s.id_pattern else {})}
    if s.id_key and s.id_first:
        props[s.id_key] = id_schema
        required.append(s.id_key)
    props[s.name_key] = {"const": tool.name}
    props[s.args_key] = params
    required += [s.name_key, s.args_key]
    if s.id_key and not s.id_first:
        props[s.id_key] = id_schema
        required.append(s.id_key)
    return b.visit(f"{tool.name}-call", {"type": "object", "properties": props, "required": required})


def _name_json_call(b: GrammarBuilder, s: ToolSyntax, tool: Tool) -> str:
    args = b.visit(f"{tool.name}-args", b.document(tool.parameters))
    name = _lit(s.name_prefix + tool.name) + (' ":" [0-9]+' if s.name_index else "")
    call_id = ""
    if s.id_open:
        call_id = _seq(_lit(s.id_open), b.rule("call-id", "[a-zA-Z0-9]{9}" if s.id_style == "mistral" else "[^\\x5B]+"))
    body = _seq(_lit(s.call_open), name, call_id, _lit(s.name_close), _lit(s.args_open), args)
    body = _seq(body, "space", _lit(s.args_close), _lit(s.call_close))
    return b.rule(f"{tool.name}-call", body)


def _xml_call(b: GrammarBuilder, s: ToolSyntax, tool: Tool) -> str:
    doc = b.document(tool.parameters)
    props = doc.get("properties") if isinstance(doc.get("properties"), dict) else {}
    assert isinstance(props, dict)
    required = set(doc.get("required", []))
    string_rule = ""
    parts: list[str] = []
    for key, spec in props.items():
        if string_typed(tool, key):
            if not string_rule:
                for rule, body in reasoning_rules(s.param_close, "xml-string").items():
                    b.rule(rule, body)
                string_rule = "xml-string"
            value = string_rule  # any text, then the closer
        else:
            value = _seq("space", b.visit(f"{tool.name}-{key}", spec), "space", _lit(s.param_close))
        value_open = _seq("space", _lit(s.value_open)) if s.value_open else ""
        param = _seq("space", _lit(s.param_open + key + s.param_name_end), value_open, value)
        rule = b.rule(f"{tool.name}-{key}-param", param)
        parts.append(rule if key in required else f"{rule}?")
    name_end = _lit(s.fn_name_end) if s.fn_name_end else '"\\n"'
    body = _seq(_lit(s.call_open), "space", _lit(s.fn_open + tool.name), name_end, *parts, "space")
    body = _seq(body, _lit(s.fn_close), "space" if s.fn_close else "", _lit(s.call_close))
    return b.rule(f"{tool.name}-call", body)


def trigger_pattern(opener: str, reasoning: tuple[str, str]) -> str:
    """A lazy-grammar pattern (llama.cpp matches it against the whole output so far) that fires at the first
    `opener` outside a reasoning block: none was opened before it, or the last one was closed."""
    start, end = (re.escape(t) for t in reasoning)
    op = re.escape(opener)
    no_block = rf"(?:(?!{start})[\s\S])*?"
    closed = rf"[\s\S]*?{end}(?:(?!{start})[\s\S])*?"
    return rf"^(?:{closed}|{no_block})({op})[\s\S]*"


def syntax_grammar(
    s: ToolSyntax,
    tools: Sequence[Tool],
    *,
    must_call: bool,
    parallel: bool,
    reasoning: tuple[str, str] | None = None,
) -> ToolGrammar:
    """The grammar for calls to `tools` in syntax `s` (see the module docstring)."""
    b = GrammarBuilder()
    make = {"json": _json_call, "name_json": _name_json_call, "xml": _xml_call}[s.shape]
    calls = [make(b, s, tool) for tool in tools]
    if s.shape == "json":
        any_call = b.rule("any-tool-call", "( " + " | ".join(calls) + " ) space")
        if s.array:
            items = f'{any_call} ( "," space {any_call} )*' if parallel else any_call
            tool_call = b.rule(
                "tool-call", _seq(_lit(s.call_open), '"[" space', items, '"]" space', _lit(s.call_close))
            )
        else:
            tool_call = b.rule("tool-call", _seq(_lit(s.call_open), "space", any_call, _lit(s.call_close), "space"))
    else:
        tool_call = b.rule("tool-call", "( " + " | ".join(calls) + " ) space")
    many = f"{tool_call}+" if parallel and not s.array else tool_call
    if s.section_open:
        many = _seq(_lit(s.section_open), "space", many, _lit(s.section_close), "space" if s.section_close else "")
    lazy = not must_call
    if not lazy and reasoning is not None:
        for rule, body in reasoning_rules(reasoning[1]).items():
            b.rule(rule, body)
        b.rule("root", f"( reasoning space )? {many}")  # the opener is text the reasoning rule takes
    else:
        b.rule("root", many)
    if not lazy:
        return ToolGrammar(b.text(), lazy=False)
    if reasoning is not None:
        return ToolGrammar(b.text(), lazy=True, trigger_patterns=(trigger_pattern(s.opener, reasoning),))
    return ToolGrammar(b.text(), lazy=True, trigger_words=(s.opener,))
