"""Reconstruction: does a stored tool reply, rendered back into the conversation, give the generated text?

After a tool turn the session stores the reply as content, reasoning and calls; the next turn renders the
conversation again, and the slot reuses its KV cache only as far as the new prompt equals what it holds
(the old prompt plus the generated text). `check` renders both sides with the template (llama-server's
`/apply-template` renderer, `runtime.templates`) and says where they part: the character offset into the
generated text, and, given a tokenizer, how many of the reply's tokens the next turn prefills again.
llama.cpp's tests call this reconstruction (`expect_reconstruction`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.templates import apply_template
from runtime.tools.calls import ParsedReply

__all__ = ["Reconstruction", "assistant_message", "check"]


@dataclass(frozen=True)
class Reconstruction:
    """The outcome of `check`: `ok` when the re-rendered conversation starts with prompt + output."""

    ok: bool
    prompt: str  # the prompt the reply was generated after
    expected: str  # prompt + the generated text
    rendered: str  # the conversation with the stored reply, rendered again (no generation prompt)
    # offset into the generated text where the two part (None: they agree; negative: the stored turn changes
    # the prompt before it, e.g. a template that drops earlier reasoning once a reply follows)
    diff_at: int | None
    tokens_again: int | None  # reply tokens that would be prefilled again (None without a tokenizer)

    def describe(self) -> str:
        """One line for a report."""
        if self.ok:
            return "reconstructs"
        at = len(self.prompt) + (self.diff_at or 0)
        tokens = f", {self.tokens_again} tokens prefilled again" if self.tokens_again is not None else ""
        want, got = self.expected[at : at + 30], self.rendered[at : at + 30]
        return f"differs at {self.diff_at}: generated {want!r}, rendered {got!r}{tokens}"


def assistant_message(reply: ParsedReply, reasoning: str = "") -> dict[str, Any]:
    """The assistant message the session stores for a parsed reply (OpenAI shape, arguments as objects)."""
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if reply.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for c in reply.tool_calls
        ]
    return msg


def check(
    template_source: str,
    raw_output: str,
    parsed: ParsedReply,
    *,
    messages: Sequence[Mapping[str, Any]] = ({"role": "user", "content": "Hi"},),
    tools: Sequence[Mapping[str, Any]] | None = None,
    reasoning: str = "",
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tokenize: Callable[[str], Sequence[int]] | None = None,
) -> Reconstruction:
    """Render `messages` (+ generation prompt) and append `raw_output`; render `messages` + the stored reply
    (`parsed`, `reasoning`); compare. `ChatTemplateError` if the template refuses either conversation."""
    kw = dict(chat_template_kwargs or {})
    prompt = apply_template(template_source, list(messages), tools=tools, chat_template_kwargs=kw)
    expected = prompt + raw_output
    stored = [*messages, assistant_message(parsed, reasoning)]
    rendered = apply_template(
        template_source, stored, tools=tools, add_generation_prompt=False, chat_template_kwargs=kw
    )
    if rendered.startswith(expected):
        return Reconstruction(True, prompt, expected, rendered, None, 0 if tokenize is not None else None)
    n = 0
    limit = min(len(expected), len(rendered))
    while n < limit and expected[n] == rendered[n]:
        n += 1
    again: int | None = None
    if tokenize is not None:
        want, got = list(tokenize(expected)), list(tokenize(rendered))
        same = 0
        while same < min(len(want), len(got)) and want[same] == got[same]:
            same += 1
        reply_tokens = len(want) - len(tokenize(prompt))
        again = min(len(want) - same, reply_tokens) if reply_tokens > 0 else len(want) - same
    return Reconstruction(False, prompt, expected, rendered, n - len(prompt), again)
