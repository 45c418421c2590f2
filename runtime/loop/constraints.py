"""What constrains a turn's reply, decided before it is queued: a response format, a raw grammar, or tools.

`Constraints.build` checks every argument (typed errors, nothing queued) and produces the grammar the
sampler consumes; after generation, `finish` turns the raw text into the reply: its content, the parsed
value (structured output) or the tool calls. The slot never sees any of this.

Structured output follows llama-server's /v1/chat/completions: the grammar is its response-format grammar
(the generation prompt, optional whitespace, the JSON value bare or in a ```json fence), fed the generation
prompt first; the reply's text is the JSON value alone, as llama-server's `message.content`. On a thinking
model the reasoning block may come first (or the grammar starts inside it, when the generation prompt opened
it), and `finish` is given the answer part: the turn splits the reasoning off before.

A raw `grammar` given together with `tools` replaces the tools' grammar: it decides the reply's text, which is
then parsed for tool calls as usual (llama-server refuses the combination; accepting it lets an app's tests force
a model, any model, to call a tool).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.backend.protocol import GrammarSpec
from runtime.errors import InvalidRequest, ToolCallParseError
from runtime.grammar import chat_response_grammar, reply_content, schema_for
from runtime.reasoning import ReasoningFormat
from runtime.tools import ToolFormat, ToolPlan
from runtime.types import FinishReason
from sessions.model import ToolCall

__all__ = ["Constraints", "Finished"]


@dataclass(frozen=True)
class Finished:
    """A reply after its constraints: what to show and store, and why it ended."""

    text: str
    finish_reason: FinishReason
    parsed: Any = None
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    tokens: tuple[int, ...] = ()  # a raw prompt's turn: the generated token ids


@dataclass(frozen=True)
class Constraints:
    """The grammar for one turn and how to read its reply."""

    grammar: GrammarSpec | None = None
    tools: ToolPlan | None = None
    parse: Callable[[str], Any] | None = None  # structured output: the reply text -> its value
    structured: bool = False  # the reply is llama-server's response format (content = the JSON value)

    @property
    def stops(self) -> tuple[str, ...]:
        return self.tools.stops if self.tools is not None else ()

    @classmethod
    def build(
        cls,
        *,
        response_format: object = None,
        grammar: object = None,
        tools: Sequence[Any] | None = None,
        tool_choice: object = "auto",
        parallel_tool_calls: bool | None = None,
        tool_format: Callable[[], ToolFormat],
        generation_prompt: Callable[[], str],
        check_grammar: Callable[[GrammarSpec], None] = lambda _spec: None,
        reasoning_format: Callable[[], ReasoningFormat | None] = lambda: None,
    ) -> Constraints:
        """Check the turn's constraints: `response_format` alone, or `grammar` and / or `tools` (the grammar then
        decides the text, the tools how it is read)."""
        given = [n for n, v in (("response_format", response_format), ("grammar", grammar), ("tools", tools)) if v]
        if response_format and len(given) > 1:
            raise InvalidRequest(f"use response_format alone, not with {' and '.join(given[1:])}")
        raw = None
        if grammar is not None:
            if not isinstance(grammar, str) or not grammar.strip():
                raise InvalidRequest("grammar must be a non-empty GBNF string with a `root` rule")
            raw = GrammarSpec(grammar)  # a user grammar is not fed the generation prompt
        if tools:
            if not isinstance(tools, Sequence) or isinstance(tools, str | bytes | Mapping):
                raise InvalidRequest("tools must be a list of tool dicts or functions")
            if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
                raise InvalidRequest("parallel_tool_calls must be true or false")
            plan = ToolPlan.build(tool_format(), tools, tool_choice, parallel=parallel_tool_calls, grammar=raw is None)
            spec = raw
            if raw is not None:
                check_grammar(raw)
            elif plan.grammar is not None:
                g = plan.grammar
                spec = GrammarSpec(g.gbnf, lazy=g.lazy, trigger_patterns=g.patterns() if g.lazy else ())
            return cls(grammar=spec, tools=plan)
        if tool_choice not in ("auto", None):
            raise InvalidRequest("tool_choice needs tools")
        if raw is not None:
            check_grammar(raw)
            return cls(grammar=raw)
        if response_format is None:
            return cls()
        schema, parse = schema_for(response_format)  # type: ignore[arg-type]
        if schema is None:
            return cls()
        prompt = generation_prompt()
        fmt = reasoning_format()
        tags = (fmt.start, fmt.end) if fmt is not None else None
        inside = fmt is not None and fmt.opens_block(prompt)
        gbnf = chat_response_grammar(schema, prompt, tags, inside)
        return cls(grammar=GrammarSpec(gbnf, prefill=prompt), parse=parse, structured=True)

    def finish(self, raw: str, finish_reason: FinishReason, *, seed: str | None = None) -> Finished:
        """The reply for `raw` model output (the answer part, on a thinking model): ReplyMismatch /
        ToolCallParseError if a finished reply breaks its constraints (the grammar makes that a bug, so
        nothing is committed). Call ids the model did not write come from `seed` (the request's: the ids
        streamed by `ToolPlan.partial` with the same seed are the final ones)."""
        if self.structured:
            text = reply_content(raw)
            if finish_reason == "length" or finish_reason == "cancelled" or self.parse is None:
                return Finished(text, finish_reason)
            return Finished(text, finish_reason, parsed=self.parse(text))
        if self.tools is None or finish_reason == "cancelled":
            return Finished(raw, finish_reason)
        try:
            reply = self.tools.parse(raw, seed=seed)
        except ToolCallParseError:
            if finish_reason == "length":  # cut inside a call: the text as it is
                return Finished(raw, finish_reason)
            raise
        if reply.tool_calls:
            return Finished(reply.content, "tool_calls", tool_calls=tuple(reply.tool_calls))
        return Finished(reply.content, finish_reason)
