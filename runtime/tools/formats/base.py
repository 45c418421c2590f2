"""The interface of a tool-call format: how to render the prompt, which grammar to sample with, how to parse.

A format is data for the other parts: the chat-template renderer takes the `RenderPlan` (messages,
the `tools` variable, extra template variables), the sampler takes the `ToolGrammar`, and the reply goes
through `parse`. The slot never sees tools.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import ToolCallParseError
from runtime.tools.calls import ParsedReply, PartialReply
from runtime.tools.grammar.builder import ToolGrammar
from runtime.tools.spec import Tool, ToolChoice

__all__ = ["RenderPlan", "ToolFormat"]


@dataclass(frozen=True)
class RenderPlan:
    """What to hand the chat template: `messages`, the `tools` variable (None: not set), extra variables."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any] = field(default_factory=dict)


class ToolFormat(ABC):
    """One tool-call syntax: prompt rendering, grammar, and parser."""

    name: str = ""
    parallel: bool = True  # whether the syntax can express several calls in one reply
    stops: tuple[str, ...] = ()  # extra stop strings while tools are offered

    @abstractmethod
    def render_plan(self, messages: list[dict[str, Any]], tools: Sequence[Tool], choice: ToolChoice) -> RenderPlan:
        """The template input for OpenAI-shaped `messages` (tool-call arguments as objects) and `tools`."""

    @abstractmethod
    def grammar(self, tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool = False) -> ToolGrammar | None:
        """The grammar for a reply under `choice` (None: unconstrained); `parallel` allows several calls."""

    @abstractmethod
    def parse_calls(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> ParsedReply:
        """Split `text` with at least one allowed tool; raise `ToolCallParseError` for a malformed call.
        Call ids come from `seed` (`runtime.tools.calls.call_id`) unless the model wrote them."""

    @abstractmethod
    def parse_partial(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> PartialReply:
        """What a prefix `text` of a reply says so far, for streaming; never raises.

        For every prefix p of a full reply t (parsed with the same tools and `seed`): the content is a prefix
        of `parse(t).content`, each call's `arguments` a prefix of `canonical_arguments` of its final
        arguments, and a call's index, id and name never change once it appears. A malformed reply says
        what it said before it went wrong. Pass the same `seed` as to `parse` (without one, ids are random).
        """

    def parse_answer(self, text: str) -> ParsedReply:
        """A reply made under the `answer` choice: plain text (a format with an answer shape unwraps it)."""
        return ParsedReply(text)

    def parse_plain(self, text: str) -> ParsedReply:
        """A reply made while no tool may be called (`tool_choice="none"`): plain text."""
        return ParsedReply(text)

    def partial(self, text: str, tools: Sequence[Tool], choice: ToolChoice, *, seed: str | None = None) -> PartialReply:
        """`parse_partial` under `choice`, as `parse` applies it (no allowed tool: the text is content)."""
        allowed = choice.allowed(tools)
        if choice.mode == "answer" or not allowed:
            return PartialReply(text)
        return self.parse_partial(text, allowed, seed=seed)

    def parse(self, text: str, tools: Sequence[Tool], choice: ToolChoice, *, seed: str | None = None) -> ParsedReply:
        """Split raw model output into content and tool calls.

        Plain text comes back unchanged as content; a malformed call, an unknown tool, arguments that do
        not validate, or no call when one is required raise `ToolCallParseError`; nothing else is raised.
        With `tool_choice="none"` (or no tools) the whole text is content.
        """
        allowed = choice.allowed(tools)
        if choice.mode == "answer":
            return self.parse_answer(text)
        if not allowed:
            return self.parse_plain(text)
        reply = self.parse_calls(text, allowed, seed=seed)
        if choice.must_call and not reply.tool_calls:
            raise ToolCallParseError(f"tool_choice {choice.name or choice.mode!r} needs a tool call", text)
        return reply
