"""The Llama 3.x tool-call syntax: the whole reply is `{"name": ..., "parameters": {...}}` (one call).

Used by templates with `<|start_header_id|>` that render `tools` themselves (Llama 3.1 / 3.2 / 3.3). As
llama-server does, the template gets `tools_in_user_message=False` (tools go to the system message, so
they stay in the cached prefix) and, when set, a fixed `date_string`. The call may follow `<|python_tag|>`;
`<|eom_id|>` is an extra stop. With `tool_choice="auto"` the grammar is lazy, triggered by a pattern that
must match the output from its start (llama-server's `PATTERN_FULL`): the reply opens with
`{"name": "` (optionally `{"type": "function", "name": "`); any other reply is free text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from runtime.errors import ToolCallParseError
from runtime.tools.calls import ParsedReply, PartialCall, PartialReply, call_id, decode_json_prefix, make_call
from runtime.tools.formats.base import RenderPlan, ToolFormat
from runtime.tools.grammar.builder import GrammarBuilder, ToolGrammar, gbnf_literal
from runtime.tools.parse import partial_json as pj
from runtime.tools.spec import Tool, ToolChoice

__all__ = ["TRIGGER_PATTERN", "Llama3Format"]

PYTHON_TAG = "<|python_tag|>"
TRIGGER_PATTERN = r'(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*")[\s\S]*'
_STARTS = ('{"name":', '{"type":"function","name":')
_CALL_START = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')


class Llama3Format(ToolFormat):
    """One JSON call as the whole reply."""

    name = "llama3"
    parallel = False
    stops = ("<|eom_id|>",)

    def __init__(self, date_string: str | None = None) -> None:
        self.date_string = date_string

    def render_plan(self, messages: list[dict[str, Any]], tools: Sequence[Tool], choice: ToolChoice) -> RenderPlan:
        kwargs: dict[str, Any] = {"tools_in_user_message": False}
        if self.date_string is not None:
            kwargs["date_string"] = self.date_string
        return RenderPlan(messages=list(messages), tools=[t.openai() for t in tools] or None, kwargs=kwargs)

    def grammar(self, tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool = False) -> ToolGrammar | None:
        allowed = choice.allowed(tools)
        if not allowed:
            return None
        b = GrammarBuilder()
        rules: list[str] = []
        for tool in allowed:
            args = b.visit(f"{tool.name}-args", b.document(tool.parameters))
            body = " ".join(
                [
                    '"{" space',
                    '( "\\"type\\"" space ":" space "\\"function\\"" space "," space )?',
                    '"\\"name\\"" space ":" space',
                    gbnf_literal(json.dumps(tool.name)),
                    'space "," space "\\"parameters\\"" space ":" space',
                    args,
                    '"}" space',
                ]
            )
            rules.append(b.rule(f"{tool.name}-call", body))
        b.rule("root", " | ".join(rules))
        lazy = not choice.must_call
        return ToolGrammar(b.text(), lazy=lazy, trigger_patterns=(TRIGGER_PATTERN,) if lazy else ())

    def parse_partial(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> PartialReply:
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
        elif PYTHON_TAG.startswith(body):
            return PartialReply("")
        if _CALL_START.match(body) is None:
            squeezed = re.sub(r"\s+", "", body)
            if any(start.startswith(squeezed) for start in _STARTS):
                return PartialReply("")  # may still become a call
            return PartialReply(text)
        try:
            node, _ = pj.parse(body, 0)
        except (pj._BadJSON, RecursionError):
            return PartialReply("")
        name = node.get("name")
        if name is None or not name.complete or name.kind != "string":
            return PartialReply("")
        args = node.get("parameters") or node.get("arguments")
        text_args = pj.canonical(args) if args is not None and args.kind == "object" else ""
        return PartialReply("", (PartialCall(0, call_id(seed, 0), name.scalar, text_args),))

    def parse_calls(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> ParsedReply:
        body = text.lstrip()
        tagged = body.startswith(PYTHON_TAG)
        if tagged:
            body = body[len(PYTHON_TAG) :]
        if _CALL_START.match(body) is None:
            if tagged or PYTHON_TAG in text:
                raise ToolCallParseError(f"{PYTHON_TAG} is not followed by a JSON tool call", text)
            return ParsedReply(text)
        value, end = decode_json_prefix(body, 0, "the tool call")
        if not isinstance(value, dict):
            raise ToolCallParseError("a tool call must be a JSON object", text)
        args = value.get("parameters", value.get("arguments", {}))
        call = make_call(value.get("name"), args, tools, text, call_id(seed, 0))
        if body[end:].strip():
            raise ToolCallParseError("text after the tool call", text)
        return ParsedReply("", (call,))
