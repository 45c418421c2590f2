"""The GBNF for the calls part of a reply in a family's `ToolSyntax`, from the call rules of
`runtime.tools.grammar.calls` (composed with the JSON-schema converter).

Rules: `tool-call` is one call of any allowed tool (`NAME-call`, per tool), `root` the calls part (section
opener, one call or, with `parallel`, several, section closer), built by the shape's type.

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
from typing import assert_never

from runtime.grammar.chat import reasoning_rules
from runtime.tools.grammar.builder import GrammarBuilder, ToolGrammar
from runtime.tools.grammar.calls import (
    gemma_call,
    harmony_call,
    json_call,
    lit,
    name_json_call,
    pythonic_call,
    seq,
    xml_call,
)
from runtime.tools.spec import Tool
from runtime.tools.syntax import shapes
from runtime.tools.syntax.shapes import ToolSyntax

__all__ = ["syntax_grammar", "trigger_pattern"]


def trigger_pattern(opener: str, reasoning: tuple[str, str], inside: bool = False) -> str:
    """A lazy-grammar pattern (llama.cpp matches it against the whole output so far) that fires at the first
    `opener` outside a reasoning block: none was opened before it, or the last one was closed. `inside`:
    the generation prompt opened the block, so the output must close it first."""
    start, end = (re.escape(t) for t in reasoning)
    op = re.escape(opener)
    no_block = rf"(?:(?!{start})[\s\S])*?"
    closed = rf"[\s\S]*?{end}(?:(?!{start})[\s\S])*?"
    return rf"^(?:{closed})({op})[\s\S]*" if inside else rf"^(?:{closed}|{no_block})({op})[\s\S]*"


def _listed(any_call: str, parallel: bool) -> str:
    """One call, or with `parallel` a comma-separated list of them."""
    return f'{any_call} ( "," space {any_call} )*' if parallel else any_call


def _tool_call(b: GrammarBuilder, s: ToolSyntax, tools: Sequence[Tool], parallel: bool) -> tuple[str, bool]:
    """The `tool-call` rule in the shape of `s`, and whether it already holds all the calls (a list)."""
    match s.shape:
        case shapes.JsonShape() as shape:
            calls = [json_call(b, shape, tool) for tool in tools]
            any_call = b.rule("any-tool-call", "( " + " | ".join(calls) + " ) space")
            if not shape.array:
                return b.rule("tool-call", seq(lit(s.call_open), "space", any_call, lit(s.call_close), "space")), False
            opened = (
                seq(lit(s.call_open), "space", lit(shape.args_open), "space") if shape.args_open else lit(s.call_open)
            )
            closed = seq(lit(shape.args_close), "space", lit(s.call_close)) if shape.args_close else lit(s.call_close)
            return b.rule("tool-call", seq(opened, '"[" space', _listed(any_call, parallel), '"]" space', closed)), True
        case shapes.PythonicShape():
            calls = [pythonic_call(b, tool) for tool in tools]
            any_call = b.rule("any-tool-call", "( " + " | ".join(calls) + " )")
            listed = _listed(any_call, parallel)
            return b.rule("tool-call", seq(lit(s.call_open), '"["', listed, '"]"', lit(s.call_close))), True
        case shapes.HarmonyShape():  # after the analysis channel: `<|start|>assistant`, then the recipient
            calls = [harmony_call(b, s, tool) for tool in tools]
            head = '( "<|start|>assistant" )? ( "<|channel|>commentary" )? " "?'
            return b.rule("tool-call", head + " ( " + " | ".join(calls) + " )"), False
        case shapes.NameJsonShape() as shape:
            calls = [name_json_call(b, s, shape, tool) for tool in tools]
        case shapes.XmlShape() as shape:
            calls = [xml_call(b, s, shape, tool) for tool in tools]
        case shapes.GemmaShape():
            calls = [gemma_call(b, s, tool) for tool in tools]
        case unknown:
            assert_never(unknown)
    return b.rule("tool-call", "( " + " | ".join(calls) + " ) space"), False


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
    tool_call, listed = _tool_call(b, s, tools, parallel)
    many = f"{tool_call}+" if parallel and not listed else tool_call
    shape = s.shape
    recipient = shape.content_recipient if isinstance(shape, shapes.NameJsonShape) else ""
    if isinstance(shape, shapes.NameJsonShape) and recipient:
        # the prompt wrote the first opener (Functionary v3.2): the first call lacks it
        firsts = [name_json_call(b, s, shape, tool, opener=False) for tool in tools]
        first = b.rule("first-tool-call", "( " + " | ".join(firsts) + " ) space")
        first = f"{first} {tool_call}*" if parallel else first
        # lazy: triggered at the first recipient, or at the opener after the content's message
        many = first if must_call else f"( {first} ) | ( {many} )"
    if s.section_open:
        many = seq(lit(s.section_open), "space", many, lit(s.section_close), "space" if s.section_close else "")
    lazy = not must_call
    if not lazy and reasoning is not None:
        for rule, body in reasoning_rules(reasoning[1]).items():
            b.rule(rule, body)
        b.rule("root", f"( reasoning space )? {many}")  # the opener is text the reasoning rule takes
    else:
        b.rule("root", many)
    if not lazy:
        return ToolGrammar(b.text(), lazy=False)
    if recipient:
        head, op = re.escape(recipient + "\n"), re.escape(s.opener)
        pattern = rf"^(?:{head}[\s\S]*?({op})|(?!{head})([A-Za-z0-9_.:-]+\n))[\s\S]*"
        return ToolGrammar(b.text(), lazy=True, trigger_patterns=(pattern,))
    if reasoning is not None:
        return ToolGrammar(b.text(), lazy=True, trigger_patterns=(trigger_pattern(s.opener, reasoning, inside),))
    bare: tuple[str, ...] = ()
    if isinstance(shape, shapes.XmlShape) and shape.bare_open:
        bare = tuple(shape.bare_open + t.name + shape.fn_name_end for t in tools)
    return ToolGrammar(b.text(), lazy=True, trigger_words=(s.opener, *bare))
