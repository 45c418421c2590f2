"""The GBNF for calls in a family's `ToolSyntax`, composed with the JSON-schema converter.

Rules: `tool-call` is one call of any allowed tool (`NAME-call`, per tool), `root` the calls part (section
opener, one call or, with `parallel`, several, section closer). Arguments are the tool's JSON schema; in
the XML shapes each parameter is a tagged value: a string parameter is any text up to its closer (the
closer cannot occur inside it), any other is JSON of its schema; the parameters come in schema order,
the required ones always, the others optionally (llama-server's XML grammars do the same).

Triggers (`auto`): the opener as a trigger word; a template with a reasoning block gets a trigger pattern
instead, which matches only once the block is closed or when no block was opened, so a call written in
the reasoning never starts the grammar (a template whose generation prompt opens the block by default:
only once it is closed; with thinking turned off in such a template, calls are then parsed but not
constrained). `required` / a name: not lazy; with a reasoning block the grammar
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
    if s.name_is_key:
        schema = {"type": "object", "properties": {tool.name: params}, "required": [tool.name]}
        return b.visit(f"{tool.name}-call", schema)
    props: dict[str, Any] = {}
    required: list[str] = []
    # an id with a fixed shape is one the template insists on (Mistral Nemo); others are optional
    id_schema: dict[str, Any] = {"type": "string", **({"pattern": s.id_pattern} if s.id_pattern else {})}
    if s.id_key and s.id_first:
        props[s.id_key] = id_schema
        required.append(s.id_key)
    props[s.name_key] = {"const": tool.name}
    props[s.args_key] = params
    required += [s.name_key, s.args_key]
    if s.id_key and not s.id_first:
        props[s.id_key] = id_schema
        if s.id_pattern:
            required.append(s.id_key)
    return b.visit(f"{tool.name}-call", {"type": "object", "properties": props, "required": required})


def _name_json_call(b: GrammarBuilder, s: ToolSyntax, tool: Tool, *, opener: bool = True) -> str:
    args = b.visit(f"{tool.name}-args", b.document(tool.parameters))
    name = _lit(s.name_prefix + tool.name) + (' ":" [0-9]+' if s.name_index else "")
    call_id = ""
    if s.id_open:
        call_id = _seq(_lit(s.id_open), b.rule("call-id", "[a-zA-Z0-9]{9}" if s.id_style == "mistral" else "[^\\x5B]+"))
    before = _seq(b.rule("call-id-before", "[^<]+"), _lit(s.id_before)) if s.id_before else ""
    body = _seq(_lit(s.call_open) if opener else "", before, name, call_id, _lit(s.name_close), _lit(s.args_open))
    body = _seq(body, args, "space", _lit(s.args_close), _lit(s.call_close))
    return b.rule(f"{tool.name}-call" if opener else f"{tool.name}-first-call", body)


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
        if s.param_close_named:
            value = _seq(value, _lit(key + s.param_name_end))
        value_open = _seq("space", _lit(s.value_open)) if s.value_open else ""
        typed = s.param_typed[0 if string_typed(tool, key) else 1]
        param = _seq("space", _lit(s.param_open + key + typed + s.param_name_end), value_open, value)
        rule = b.rule(f"{tool.name}-{key}-param", param)
        parts.append(rule if key in required else f"{rule}?")
    name_end = _lit(s.fn_name_end) if s.fn_name_end else '"\\n"?'
    if s.fn_head_end:
        name_end = _seq(name_end, "[^<]*", _lit(s.fn_head_end))
    opener = f"( {_lit(s.call_open)} space )?" if s.bare_open else _seq(_lit(s.call_open), "space")
    body = _seq(s.head_gbnf, opener, _lit(s.fn_open + tool.name), name_end, *parts, "space")
    body = _seq(body, _lit(s.fn_close), "space" if s.fn_close else "", _lit(s.call_close))
    return b.rule(f"{tool.name}-call", body)


def _pythonic_call(b: GrammarBuilder, s: ToolSyntax, tool: Tool) -> str:
    """LFM2: NAME(key=value, ...), the required keys in schema order, then the optional ones; values as JSON
    of their schema, except booleans and null in Python's spelling."""
    doc = b.document(tool.parameters)
    props = doc.get("properties") if isinstance(doc.get("properties"), dict) else {}
    assert isinstance(props, dict)
    required = [k for k in props if k in set(doc.get("required", []))]
    optional = [k for k in props if k not in required]
    params: dict[str, str] = {}
    for key in props:
        spec = props[key]
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind == "boolean":
            value = '( "True" | "False" )'
        elif kind == "null":
            value = '"None"'
        elif string_typed(tool, key) and "enum" not in spec and "const" not in spec:
            json_string = b.visit(f"{tool.name}-{key}", spec)
            quoted = b.rule("py-string", '"\'" ( [^\'\\\\\\x00-\\x1F] | "\\\\" [^\\x00-\\x1F] )* "\'"')
            value = f"( {json_string} | {quoted} )"
        else:
            value = b.visit(f"{tool.name}-{key}", spec)
        params[key] = b.rule(f"{tool.name}-{key}-kw", f"{gbnf_literal(key + '=')} {value}")
    sep = '"," space'
    if required:
        body = f" {sep} ".join(params[k] for k in required) + "".join(f" ( {sep} {params[k]} )?" for k in optional)
    elif optional:
        body = (
            "( ( "
            + " | ".join(params[k] for k in optional)
            + f" ) ( {sep} ( "
            + " | ".join(params[k] for k in optional)
            + " ) )* )?"
        )
    else:
        body = ""
    return b.rule(f"{tool.name}-call", _seq(gbnf_literal(tool.name + "("), body, '")"'))


def _gemma_call(b: GrammarBuilder, s: ToolSyntax, tool: Tool) -> str:
    """Gemma 4: NAME{key:value,...} with the keys sorted (its template's `dictsort`), the required ones always;
    strings in `<|"|>` quotes, booleans bare, anything else JSON of its schema."""
    doc = b.document(tool.parameters)
    props = doc.get("properties") if isinstance(doc.get("properties"), dict) else {}
    assert isinstance(props, dict)
    required = set(doc.get("required", []))
    keys = sorted(props)
    items: list[str] = []
    for key in keys:
        spec = props[key]
        kind = spec.get("type") if isinstance(spec, dict) else None
        if string_typed(tool, key) and "enum" not in spec and "const" not in spec:
            for rule, body in reasoning_rules('<|"|>', "gemma-string").items():
                b.rule(rule, body)
            value = '"<|\\"|>" gemma-string'
        elif kind == "boolean":
            value = '( "true" | "false" )'
        else:
            value = b.visit(f"{tool.name}-{key}", spec)
        items.append(b.rule(f"{tool.name}-{key}-kv", f"{gbnf_literal(key + ':')} {value}"))
    first, rest = "", ""  # the keys from i on, with nothing / something written before
    for i in range(len(keys) - 1, -1, -1):
        tail_rest, tail_first = rest, first
        with_item_rest = _seq('","', items[i], tail_rest)
        with_item_first = _seq(items[i], tail_rest)
        if keys[i] in required:
            rest = b.rule(f"{tool.name}-rest-{i}", with_item_rest)
            first = b.rule(f"{tool.name}-first-{i}", with_item_first)
        else:
            rest = b.rule(
                f"{tool.name}-rest-{i}",
                f"( {with_item_rest} )?" if not tail_rest else f"( {with_item_rest} ) | {tail_rest}",
            )
            alt = f" | {tail_first}" if tail_first else ""
            first = b.rule(
                f"{tool.name}-first-{i}", f"( {with_item_first} ){alt}" if alt else f"( {with_item_first} )?"
            )
    return b.rule(f"{tool.name}-call", _seq(_lit(s.call_open + tool.name + "{"), first, '"}"', _lit(s.call_close)))


def _harmony_call(b: GrammarBuilder, s: ToolSyntax, tool: Tool) -> str:
    """gpt-oss: the recipient, then the channel header its template writes, then the JSON arguments."""
    args = b.visit(f"{tool.name}-args", b.document(tool.parameters))
    head = _lit(s.call_open + tool.name) + ' "<|channel|>commentary" ( " json" | " <|constrain|>json" )? "<|message|>"'
    return b.rule(f"{tool.name}-call", _seq(head, args))


def trigger_pattern(opener: str, reasoning: tuple[str, str], inside: bool = False) -> str:
    """A lazy-grammar pattern (llama.cpp matches it against the whole output so far) that fires at the first
    `opener` outside a reasoning block: none was opened before it, or the last one was closed. `inside`:
    the generation prompt opened the block, so the output must close it first."""
    start, end = (re.escape(t) for t in reasoning)
    op = re.escape(opener)
    no_block = rf"(?:(?!{start})[\s\S])*?"
    closed = rf"[\s\S]*?{end}(?:(?!{start})[\s\S])*?"
    return rf"^(?:{closed})({op})[\s\S]*" if inside else rf"^(?:{closed}|{no_block})({op})[\s\S]*"


def syntax_grammar(
    s: ToolSyntax,
    tools: Sequence[Tool],
    *,
    must_call: bool,
    parallel: bool,
    reasoning: tuple[str, str] | None = None,
    inside: bool = False,
) -> ToolGrammar:
    """The grammar for calls to `tools` in syntax `s` (see the module docstring)."""
    b = GrammarBuilder()
    make = {
        "json": _json_call,
        "name_json": _name_json_call,
        "xml": _xml_call,
        "harmony": _harmony_call,
        "pythonic": _pythonic_call,
        "gemma": _gemma_call,
    }[s.shape]
    calls = [make(b, s, tool) for tool in tools]
    if s.shape == "json":
        any_call = b.rule("any-tool-call", "( " + " | ".join(calls) + " ) space")
        if s.array:
            items = f'{any_call} ( "," space {any_call} )*' if parallel else any_call
            opened = _seq(_lit(s.call_open), "space", _lit(s.args_open), "space") if s.args_open else _lit(s.call_open)
            closed = _seq(_lit(s.args_close), "space", _lit(s.call_close)) if s.args_close else _lit(s.call_close)
            tool_call = b.rule("tool-call", _seq(opened, '"[" space', items, '"]" space', closed))
        else:
            tool_call = b.rule("tool-call", _seq(_lit(s.call_open), "space", any_call, _lit(s.call_close), "space"))
    elif s.shape == "pythonic":
        any_call = b.rule("any-tool-call", "( " + " | ".join(calls) + " )")
        items = f'{any_call} ( "," space {any_call} )*' if parallel else any_call
        tool_call = b.rule("tool-call", _seq(_lit(s.call_open), '"["', items, '"]"', _lit(s.call_close)))
    elif s.shape == "harmony":  # after the analysis channel: `<|start|>assistant`, then the recipient
        head = '( "<|start|>assistant" )? ( "<|channel|>commentary" )? " "?'
        tool_call = b.rule("tool-call", head + " ( " + " | ".join(calls) + " )")
    else:
        tool_call = b.rule("tool-call", "( " + " | ".join(calls) + " ) space")
    many = f"{tool_call}+" if parallel and not s.array and s.shape != "pythonic" else tool_call
    if s.content_recipient:  # the prompt wrote the first opener (Functionary v3.2): the first call lacks it
        firsts = [_name_json_call(b, s, tool, opener=False) for tool in tools]
        first = b.rule("first-tool-call", "( " + " | ".join(firsts) + " ) space")
        first = f"{first} {tool_call}*" if parallel else first
        # lazy: triggered at the first recipient, or at the opener after the content's message
        many = first if must_call else f"( {first} ) | ( {many} )"
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
    if s.content_recipient:
        head, op = re.escape(s.content_recipient + "\n"), re.escape(s.opener)
        pattern = rf"^(?:{head}[\s\S]*?({op})|(?!{head})([A-Za-z0-9_.:-]+\n))[\s\S]*"
        return ToolGrammar(b.text(), lazy=True, trigger_patterns=(pattern,))
    if reasoning is not None:
        return ToolGrammar(b.text(), lazy=True, trigger_patterns=(trigger_pattern(s.opener, reasoning, inside),))
    bare = tuple(s.bare_open + t.name + s.fn_name_end for t in tools) if s.bare_open else ()
    return ToolGrammar(b.text(), lazy=True, trigger_words=(s.opener, *bare))
