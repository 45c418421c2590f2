"""`SyntaxFormat`: a `ToolFormat` made from a family's `ToolSyntax` (runtime.tools.syntax), and `HermesFormat`,
the one for Hermes / Qwen `<tool_call>` JSON (`HERMES`) by name.

- `render_plan`: native, so the template gets the tools and the tool history as they are, the same under
  every `tool_choice` (only the grammar differs). Arguments go as objects; the renderer passes them on as
  llama-server does (objects where the template's caps allow, else JSON strings: `args_string`).
- `grammar`: `auto` is lazy, triggered by the calls' opener (text before it is free) and never inside a
  reasoning block (the trigger pattern needs the block closed first); `required` or a tool name apply
  from the first token after an optional reasoning block; `none` gives no grammar (the tools are still
  rendered).
- `parse_calls` / `parse_partial`: the one scanner of `runtime.tools.parse.scan`, whole or on a prefix; ids are
  the ones the model wrote (Mistral's `[CALL_ID]`, Kimi's `functions.NAME:IDX`), else
  `call_id(seed, index, id_style)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from runtime.errors import ToolCallParseError
from runtime.tools.calls import ParsedReply, PartialCall, PartialReply, call_id, make_call
from runtime.tools.formats.base import RenderPlan, ToolFormat
from runtime.tools.grammar.builder import ToolGrammar
from runtime.tools.grammar.syntax import syntax_grammar
from runtime.tools.parse.scan import scan
from runtime.tools.spec import Tool, ToolChoice
from runtime.tools.syntax.families import HERMES
from runtime.tools.syntax.shapes import ToolSyntax
from sessions.model import ToolCall

__all__ = ["HermesFormat", "SyntaxFormat", "string_arguments"]


def string_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with every tool call's arguments as a JSON string (canonical form)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for tc in calls:
                fn = dict(tc.get("function", {}))
                if not isinstance(fn.get("arguments"), str):
                    fn["arguments"] = json.dumps(fn.get("arguments", {}), ensure_ascii=False)
                fixed.append({**tc, "function": fn})
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


class SyntaxFormat(ToolFormat):
    """A family's native syntax: the template renders the tools, the model writes calls its own way."""

    def __init__(
        self,
        syntax: ToolSyntax,
        *,
        args_string: bool = False,
        reasoning: tuple[str, str] | None = None,
        inside: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.syntax = syntax
        self.inside = inside  # the template's generation prompt opens the reasoning block (by default)
        self.args_string = args_string
        self.reasoning = reasoning
        self.kwargs = dict(kwargs or {})
        self.name = syntax.name
        self.parallel = syntax.parallel
        self.stops = syntax.stops

    def __repr__(self) -> str:
        return f"SyntaxFormat({self.syntax.name!r}, args_string={self.args_string})"

    def render_plan(self, messages: list[dict[str, Any]], tools: Sequence[Tool], choice: ToolChoice) -> RenderPlan:
        specs = [t.openai() for t in tools]
        kwargs = dict(self.kwargs)
        if self.syntax.tools_variable:  # the template reads the tools as JSON text (FireFunction v2: `functions`)
            kwargs[self.syntax.tools_variable] = json.dumps(specs, indent=2, ensure_ascii=False) if specs else ""
        return RenderPlan(messages=list(messages), tools=specs or None, kwargs=kwargs)

    def grammar(self, tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool = False) -> ToolGrammar | None:
        allowed = choice.allowed(tools)
        if not allowed:
            return None
        return syntax_grammar(
            self.syntax,
            allowed,
            must_call=choice.must_call,
            parallel=parallel,
            reasoning=self.reasoning,
            inside=self.inside,
        )

    def _ids(self, index: int, written: str | None, name: str, seed: str | None) -> str:
        return written if written else call_id(seed, index, self.syntax.id_style, name)

    def parse_calls(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> ParsedReply:
        found = scan(self.syntax, text, tools, final=True)
        if found.error is not None:
            raise ToolCallParseError(found.error, text)
        if not found.calls:
            closer = self.syntax.call_close
            if closer and re.search(re.escape(closer), text) and closer.startswith("</"):
                raise ToolCallParseError(f"a {closer} without its opening {self.syntax.opener}", text)
            return ParsedReply(found.content)
        calls: list[ToolCall] = []
        for i, raw in enumerate(found.calls):
            value = raw.value if raw.value is not None else {}
            calls.append(make_call(raw.name, value, tools, text, self._ids(i, raw.written_id, raw.name, seed)))
        return ParsedReply(found.content, tuple(calls))

    def parse_partial(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> PartialReply:
        try:
            found = scan(self.syntax, text, tools, final=False)
        except Exception:  # never raises: a prefix the scanner cannot read says nothing yet
            return PartialReply("")
        calls = tuple(
            PartialCall(i, self._ids(i, raw.written_id, raw.name, seed), raw.name, raw.arguments)
            for i, raw in enumerate(found.calls)
        )
        return PartialReply(found.content, calls)


class HermesFormat(SyntaxFormat):
    """`<tool_call>` JSON `</tool_call>` blocks after optional text (Qwen 2.5, Qwen 3, Hermes 2 Pro / 3, SmolLM3
    ...): the `SyntaxFormat` of `HERMES`, kept by name for the callers that construct it directly."""

    def __init__(
        self,
        syntax: ToolSyntax = HERMES,
        *,
        args_string: bool = False,
        reasoning: tuple[str, str] | None = None,
        inside: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(syntax, args_string=args_string, reasoning=reasoning, inside=inside, kwargs=kwargs)
