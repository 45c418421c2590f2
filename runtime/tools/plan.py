"""One request's tools, decided before anything is queued: `ToolPlan.build` checks the tools and the
`tool_choice` and builds the grammar (so a schema the grammar converter refuses fails here); the plan then
renders the prompt input, gives the grammar to the sampler and parses the reply."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.tools.calls import ParsedReply, PartialReply
from runtime.tools.formats.base import RenderPlan, ToolFormat
from runtime.tools.grammar.builder import ToolGrammar
from runtime.tools.spec import Tool, ToolChoice, as_tools, resolve_tool_choice

__all__ = ["ToolPlan", "result_text"]


@dataclass(frozen=True)
class ToolPlan:
    """The tools of one request in one format: what to render, the grammar, and the parser."""

    format: ToolFormat
    tools: tuple[Tool, ...]
    choice: ToolChoice
    grammar: ToolGrammar | None
    parallel: bool = False
    single: bool = False  # `parallel_tool_calls: false`: a reply keeps at most its first call, whatever the grammar

    @classmethod
    def build(
        cls,
        fmt: ToolFormat,
        tools: Sequence[Tool | Mapping[str, Any] | Callable[..., Any]],
        tool_choice: object = "auto",
        *,
        parallel: bool | None = False,
        grammar: bool = True,
    ) -> ToolPlan:
        """Check everything and build the grammar; `InvalidTool`, or the converter's error for a bad schema.
        `grammar=False`: no grammar (a raw grammar of the caller's decides the text; the plan renders and parses).
        `parallel`: True lets the grammar admit several calls (where the format can write them); False and None
        admit one, then the end of the reply; False also makes `parse` keep only the first call (a raw grammar
        may still write several). llama-server's false limits calls only inside one section: formats with one
        opener per call (Hermes `<tool_call>`) still get several there; turnstile keeps to the API's meaning."""
        checked = as_tools(tools)
        choice = resolve_tool_choice(tool_choice, checked)
        several = parallel is True and fmt.parallel
        built = fmt.grammar(checked, choice, parallel=several) if grammar else None
        return cls(fmt, checked, choice, built, several, single=parallel is False)

    def render_plan(self, messages: list[dict[str, Any]]) -> RenderPlan:
        """The chat template's input for OpenAI-shaped `messages` (e.g. `Session.chat_messages()`)."""
        return self.format.render_plan(messages, self.tools, self.choice)

    @property
    def stops(self) -> tuple[str, ...]:
        """Extra stop strings of the format (none unless tools may be called)."""
        return self.format.stops if self.choice.allowed(self.tools) else ()

    def parse(self, text: str, *, seed: str | None = None) -> ParsedReply:
        """The reply's content and tool calls; `ToolCallParseError` for a malformed or missing call. Ids the
        model did not write come from `seed` (random without one)."""
        reply = self.format.parse(text, self.tools, self.choice, seed=seed)
        if self.single and len(reply.tool_calls) > 1:
            return ParsedReply(reply.content, reply.tool_calls[:1])
        return reply

    def partial(self, text: str, *, seed: str | None = None) -> PartialReply:
        """What a prefix of the reply says so far (streaming; never raises): pass `parse` the same `seed`."""
        part = self.format.partial(text, self.tools, self.choice, seed=seed)
        if self.single and len(part.calls) > 1:
            return PartialReply(part.content, part.calls[:1])
        return part

    def tool(self, name: str) -> Tool | None:
        """The tool called `name`, if offered."""
        return next((t for t in self.tools if t.name == name), None)


def result_text(value: object) -> str:
    """A tool result as the text of the tool message: strings as they are, anything else as JSON (msgspec;
    values it cannot encode become their `str`)."""
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value, enc_hook=str).decode()
