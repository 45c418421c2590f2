"""The Hermes / Qwen tool-call syntax: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Used by templates that render `tools` themselves and contain `<tool_call>` (Qwen 2.5, Qwen 3, Hermes 2
Pro / Hermes 3, SmolLM3 ...). The template gets the tools and the messages as they are (tool-call
arguments as objects). With `tool_choice="auto"` the grammar is lazy, triggered by the word
`<tool_call>` (text before it is free); `required` or a tool name make it apply from the first token.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from runtime.errors import ToolCallParseError
from runtime.tools.base import RenderPlan, ToolFormat
from runtime.tools.calls import ParsedReply, decode_json_prefix, make_call
from runtime.tools.grammar import GrammarBuilder, ToolGrammar, gbnf_literal
from runtime.tools.spec import Tool, ToolChoice
from sessions.model import ToolCall

__all__ = ["HermesFormat"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat(ToolFormat):
    """`<tool_call>` JSON `</tool_call>` blocks after optional text."""

    name = "hermes"

    def render_plan(self, messages: list[dict[str, Any]], tools: Sequence[Tool], choice: ToolChoice) -> RenderPlan:
        return RenderPlan(messages=list(messages), tools=[t.openai() for t in tools] or None)

    def grammar(self, tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool = False) -> ToolGrammar | None:
        allowed = choice.allowed(tools)
        if not allowed:
            return None
        b = GrammarBuilder()
        calls: list[str] = []
        for tool in allowed:
            params = b.document(tool.parameters)
            call = {
                "type": "object",
                "properties": {"name": {"const": tool.name}, "arguments": params},
                "required": ["name", "arguments"],
            }
            calls.append(b.visit(f"{tool.name}-call", call))
        any_call = b.rule("any-tool-call", "( " + " | ".join(calls) + " ) space")
        tool_call = b.rule("tool-call", f"{gbnf_literal(OPEN)} space {any_call} {gbnf_literal(CLOSE)} space")
        b.rule("root", f"{tool_call}+" if parallel else tool_call)
        lazy = not choice.must_call
        return ToolGrammar(b.text(), lazy=lazy, trigger_words=(OPEN,) if lazy else ())

    def parse_calls(self, text: str, tools: Sequence[Tool]) -> ParsedReply:
        start = text.find(OPEN)
        if start < 0:
            if re.search(r"</?tool_call", text):
                raise ToolCallParseError("a tool_call tag without its opening <tool_call>", text)
            return ParsedReply(text)
        content = text[:start].strip()
        calls: list[ToolCall] = []
        i = start
        while True:
            value, i = decode_json_prefix(text, i + len(OPEN), "the tool call")
            if not isinstance(value, dict):
                raise ToolCallParseError("a tool call must be a JSON object", text)
            calls.append(make_call(value.get("name"), value.get("arguments", {}), tools, text))
            i = _skip_space(text, i)
            if not text.startswith(CLOSE, i):
                raise ToolCallParseError(f"the tool call is not closed by {CLOSE}", text)
            i = _skip_space(text, i + len(CLOSE))
            if i == len(text):
                return ParsedReply(content, tuple(calls))
            if not text.startswith(OPEN, i):
                raise ToolCallParseError("text after the tool calls", text)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
