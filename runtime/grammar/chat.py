"""The grammar llama-server's /v1/chat/completions builds for `response_format`, and the reply's content.

With `response_format` {"type": "json_schema", "json_schema": {"schema": S}} (or {"type":
"json_object"}, S = {"type": "object"}) and a chat template without tools (SmolLM2's ChatML), the
server builds a PEG chat parser (common/chat-auto-parser-generator.cpp, `autoparser::build_parser`)
and turns it into GBNF (common/peg-parser.cpp, `common_peg_arena::build_grammar`) with one
SchemaConverter: the generation prompt, optional whitespace, then the JSON value either bare or in
a ```json fence. The grammar is not lazy and has no triggers; the sampler feeds it the generation
prompt's tokens before the first sampled token (common/sampling.cpp, "prefill"), so generated text
starts right after that prefix. `message.content` is the JSON value alone, without the fence and the
whitespace around it (`reply_content`). Checked against llama-server (same build) on SmolLM2.

A thinking model's grammar lets the reasoning block come first, as llama-server's parser does (`reasoning?
content`): after the generation prompt, an optional `<think>…</think>` (any text without the closer), or,
when the generation prompt opened the block, the rest of it up to the closer; then the JSON as above.
`reply_content` is then given the answer part (the split comes first).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from runtime.errors import UnsupportedSchema
from runtime.grammar.gbnf import format_literal
from runtime.grammar.json_schema import SchemaConverter

__all__ = ["CHATML_GENERATION_PROMPT", "JSON_VALUE_RULES", "chat_response_grammar", "reasoning_rules", "reply_content"]

CHATML_GENERATION_PROMPT = "<|im_start|>assistant\n"

# the PEG parser's generic JSON rules (reachable from the schema node, so emitted, though unused)
JSON_VALUE_RULES: dict[str, str] = {
    "json-array": '"[" space ("]" | json-value (space "," space json-value)* space "]")',
    "json-bool": '"true" | "false"',
    "json-null": '"null"',
    "json-number": '"-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? (("e" | "E") [+-]? [0-9]+)?',
    "json-object": (
        '"{" space ("}" | json-string space ":" space json-value'
        ' (space "," space json-string space ":" space json-value)* space "}")'
    ),
    "json-string": '"\\"" ( [^"\\\\] | "\\\\" ( ["\\\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\\""',
    "json-value": "json-object | json-array | json-string | json-number | json-bool | json-null",
}

_FAILED = "Unable to generate parser for this template. Automatic parser generation failed: "
_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale, what the PEG parser's space skips
_DECODER = json.JSONDecoder()


def _class_char(c: str) -> str:
    return "\\" + c if c in "[]\\^-" else {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, c)


def reasoning_rules(end: str, name: str = "reasoning") -> dict[str, str]:
    """GBNF rules `name` = any text up to and including the first `end` (a small automaton over `end`'s
    characters: the body never contains the closer, so the block ends where the splitter ends it).

    Exact when `end`'s first character does not occur again in it (every closer the formats know); the
    rule names are `name`, `name-1`, … `name-(len-1)`."""
    if not end:
        raise ValueError("a reasoning block needs a closer")
    c0 = end[0]
    state = [name] + [f"{name}-{k}" for k in range(1, len(end))]
    rules: dict[str, str] = {}
    for k, ck in enumerate(end):
        nxt = format_literal(ck) + ("" if k == len(end) - 1 else " " + state[k + 1])
        if k == 0:
            rules[state[0]] = f"[^{_class_char(c0)}] {state[0]} | {nxt}"
        else:
            others = _class_char(ck) + ("" if ck == c0 else _class_char(c0))
            restart = "" if ck == c0 else f" | {format_literal(c0)} {state[1]}"
            rules[state[k]] = f"{nxt}{restart} | [^{others}] {state[0]}"
    return rules


def chat_response_grammar(
    schema: Mapping[str, Any],
    generation_prompt: str = CHATML_GENERATION_PROMPT,
    reasoning: tuple[str, str] | None = None,
    inside: bool = False,
) -> str:
    """The GBNF llama-server uses for a chat completion whose response_format has this schema.

    `generation_prompt` is what the chat template appends for the assistant's turn (the text the
    prompt gains with add_generation_prompt); the grammar starts with it, so a sampler using this
    grammar must first accept that text's tokens, as llama-server does. Raises `UnsupportedSchema`
    with llama-server's message for a schema it rejects.
    """
    converter = SchemaConverter()
    converter.resolve_refs(schema, "")
    for name, body in JSON_VALUE_RULES.items():
        converter.add_rule(name, body)
    try:
        converter.add_rule("response-format", converter.visit(schema, "response-format-schema"))
        body = '("```json" space response-format space "```" | space response-format space)'
        prefix = format_literal(generation_prompt) + " " if generation_prompt else ""
        if reasoning is not None:
            start, end = reasoning
            for rule, rule_body in reasoning_rules(end).items():
                converter.add_rule(rule, rule_body)
            prefix += "reasoning " if inside else f"({format_literal(start)} reasoning)? "
        converter.add_rule("root", prefix + "space space " + body)
        return converter.format_grammar()
    except UnsupportedSchema as err:
        raise UnsupportedSchema(_FAILED + err.reason) from None


def reply_content(text: str) -> str:
    """The reply's `message.content` as llama-server derives it from the generated text.

    Leading whitespace and an opening ```json fence (with the whitespace after it) are skipped; the
    content is then the first complete JSON value, or, when the text stops inside the value (a reply
    cut by max_tokens), everything up to the end of the text.
    """
    content = text.lstrip(_C_SPACE)
    if content.startswith("```json"):
        content = content[len("```json") :].lstrip(_C_SPACE)
    try:
        _, end = _DECODER.raw_decode(content)
    except ValueError:
        return content
    return content[:end]
