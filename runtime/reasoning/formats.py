"""Reasoning ("thinking") syntaxes as data: one `ReasoningFormat` entry per family, and `detect` for a template.

A format says how a model marks its reasoning in generated text: the block's opener and closer, the
literal headers that may open the answer after it (Command R7B's `<|START_RESPONSE|>`, gpt-oss's final
channel header), the trailers that may close the answer, and how to tell the family from its chat
template's source. The splitter (`runtime.reasoning.split`), the grammar planner and the budget all
read the same entry; adding a family is one entry in `FORMATS` and touches nothing else.

The syntaxes are the ones llama-server's parser knows (common/chat*.cpp, its expected parses in
tests/test-chat.cpp). Templates whose generation prompt already opens the block (QwQ, the R1 distills,
Qwen3.5, MiniMax, Nemotron 3) are not separate formats: the splitter is told whether generation starts
inside the block (`opens_block`), as llama-server decides it from the generation prompt.

Invariants: `start` and `end` are non-empty and different; `markers` are what `detect` looks for, in
`FORMATS` order (the first format with a marker in the template wins, so the specific ones come first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["FORMATS", "ReasoningFormat", "by_name", "detect", "with_template"]


@dataclass(frozen=True)
class ReasoningFormat:
    """How one family writes its reasoning block, and how its answer is wrapped."""

    name: str
    start: str  # the opener, e.g. "<think>"
    end: str  # the closer, e.g. "</think>"
    markers: tuple[str, ...]  # any of these in a template's source identifies the family
    content_prefixes: tuple[str, ...] = ()  # literal headers before the answer, dropped (repeatedly)
    content_suffixes: tuple[str, ...] = ()  # literal trailers of the answer, dropped
    switch: str | None = "enable_thinking"  # the template variable that turns thinking off (None: none)
    # whitespace skipped after the closer: None any (llama-server's `reasoning << content`), else at most this
    # (the template's own, after its closer: what llama-server's autoparser finds, `with_template`)
    space_after: str | None = None
    # whitespace taken after the opener: None any; else at most this (llama-server's autoparser: `optspace`)
    space_after_start: str | None = None
    trim: bool = True  # the reasoning's trailing whitespace is dropped (no template facts); False: kept
    derive: bool = True  # `with_template` reads `space_after` from the template (False: fixed, a dedicated parser)
    # what the generation prompt writes after the opener, in the block (Apriel 1.6's "Here are my reasoning steps:")
    preamble: str = ""
    # the literals `reasoning_format: none` drops from the text (None: the answer headers that are not block tags);
    # as llama-server: Command R7B's answer markers go, Granite's `<response>` tags stay
    plain_drops: tuple[str, ...] | None = None
    # the answer headers and trailers wrap the answer only after a block (Granite 3.x; llama-server's
    # WRAPPED_WITH_REASONING): an answer without one keeps them as text
    wrapped_after_block: bool = False

    def __post_init__(self) -> None:
        if not self.start or not self.end or self.start == self.end:
            raise ValueError(f"reasoning format {self.name}: start and end must be non-empty and different")

    @property
    def tags(self) -> tuple[str, ...]:
        """Every literal the format gives meaning to (what a detokenizer must render as text)."""
        return (self.start, self.end, *self.content_prefixes, *self.content_suffixes)

    def opens_block(self, prompt: str) -> bool:
        """Whether a prompt ending like this makes the output start inside the block (its generation prompt
        ends with the opener, e.g. QwQ's `<|im_start|>assistant\\n<think>\\n`)."""
        tail = prompt.rstrip()
        preamble = self.preamble.strip()
        if (
            preamble
        ):  # the opener, then the preamble (Apriel 1.6: `<|begin_assistant|>\\nHere are my reasoning steps:\\n`)
            if not tail.endswith(preamble):
                return False
            tail = tail[: len(tail) - len(preamble)].rstrip()
        return tail.endswith(self.start)

    def closes_block(self, prompt: str) -> bool:
        """Whether a prompt ending like this wrote an empty block (Qwen3's thinking-off generation prompt ends
        with `<think>\\n\\n</think>\\n\\n`): llama-server parses the output as if it followed that block."""
        tail = prompt.rstrip()
        if not tail.endswith(self.end):
            return False
        at = tail.rfind(self.start, 0, len(tail) - len(self.end))
        return at >= 0 and not tail[at + len(self.start) : len(tail) - len(self.end)].strip()

    def dropped_when_kept(self) -> tuple[str, ...]:
        """The literals `reasoning_format: none` drops (a header that is also a block tag stays text)."""
        if self.plain_drops is not None:
            return self.plain_drops
        return tuple(h for h in self.content_prefixes if h not in (self.start, self.end))


THINK = ReasoningFormat("think", "<think>", "</think>", ("<think>", "</think>"))
HARMONY = ReasoningFormat(  # gpt-oss: the analysis channel is the reasoning, the final channel the answer
    "harmony",
    "<|channel|>analysis<|message|>",
    "<|end|>",
    ("<|channel|>",),
    content_prefixes=("<|start|>assistant", "<|channel|>final<|message|>", "<|channel|>commentary<|message|>"),
    content_suffixes=("<|return|>", "<|end|>"),
    switch=None,
    space_after="",
    space_after_start="",
    trim=False,
    derive=False,
)
COMMAND_R7B = ReasoningFormat(
    "command-r7b",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    ("<|START_THINKING|>",),
    content_prefixes=("<|START_RESPONSE|>",),
    content_suffixes=("<|END_RESPONSE|>",),
    plain_drops=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
)
# the families llama-server parses with a dedicated parser: their spaces are fixed (measured against it)
MAGISTRAL = ReasoningFormat(
    "magistral", "[THINK]", "[/THINK]", ("[THINK]",), switch=None, space_after_start="", trim=False, derive=False
)
SEED_OSS = ReasoningFormat("seed-oss", "<seed:think>", "</seed:think>", ("<seed:think>",))
MINIMAX_M3 = ReasoningFormat(  # a turn without reasoning starts with a bare `</mm:think>` (test-chat.cpp)
    "minimax-m3",
    "<mm:think>",
    "</mm:think>",
    ("<mm:think>",),
    content_prefixes=("</mm:think>",),
    space_after="",
    trim=False,
    derive=False,
)
GEMMA4 = ReasoningFormat(
    "gemma4", "<|channel>thought", "<channel|>", ("<|channel>thought",), space_after="", trim=False, derive=False
)
GRANITE = ReasoningFormat(  # Granite 3.x: <think>…</think><response>…</response>
    "granite",
    "<think>",
    "</think>",
    ("<response>",),
    content_prefixes=("<response>",),
    content_suffixes=("</response>",),
    plain_drops=(),
    wrapped_after_block=True,
)
# Apriel 1.6 Thinker: the generation prompt opens the reasoning with a preamble, `[BEGIN FINAL RESPONSE]` ends it;
# as llama-server, the block runs from the assistant header on (its "none" keeps the header in the text)
APRIEL = ReasoningFormat(
    "apriel",
    "<|begin_assistant|>",
    "[BEGIN FINAL RESPONSE]",
    ("Here are my reasoning steps:",),
    switch=None,
    space_after="\n",
    space_after_start="\n",
    trim=False,
    derive=False,
    preamble="Here are my reasoning steps:\n",
)

# detection order: specific markers first; plain <think> tags (Qwen3, DeepSeek R1, QwQ, SmolLM3, GLM,
# Kimi K2 Thinking, Nemotron, MiniMax M2, …) last
KIMI_K3 = ReasoningFormat(  # XTML sections: think (opened by the generation prompt), response, tools, message
    "kimi-k3",
    "<|open|>think<|sep|>",
    "<|close|>think<|sep|>",
    ("<|end_of_msg|>",),  # the tags are built by the template's open_tag / close_tag macros
    content_prefixes=("<|open|>response<|sep|>",),
    content_suffixes=("<|close|>response<|sep|>", "<|close|>message<|sep|>"),
    space_after="",
    trim=False,
    derive=False,
)

FORMATS: tuple[ReasoningFormat, ...] = (
    KIMI_K3,
    APRIEL,
    HARMONY,
    COMMAND_R7B,
    MAGISTRAL,
    SEED_OSS,
    MINIMAX_M3,
    GEMMA4,
    GRANITE,
    THINK,
)


def detect(template: str | None) -> ReasoningFormat | None:
    """The reasoning format of a chat template's source, or None for a template that knows no reasoning
    (Granite's entry also takes MiniMax M2, whose template has both tags: both parse the same way)."""
    if not template:
        return None
    for fmt in FORMATS:
        if any(m in template for m in fmt.markers):
            return fmt
    return None


_PROBE_REASONING, _PROBE_CONTENT = "\x00reasoning\x00", "\x00answer\x00"


def with_template(fmt: ReasoningFormat, render: Callable[[list[dict[str, Any]]], str]) -> ReasoningFormat:
    """`fmt` with the whitespace its template writes after the closer (llama-server's autoparser finds the
    closer the same way, by rendering an assistant message with reasoning: Qwen3.5 writes `</think>\n\n`,
    Seed-OSS `</seed:think>\n`, and a template that drops the reasoning nothing, so the answer keeps its
    leading whitespace). `render(messages)` renders without a generation prompt; a template that fails on the
    probe leaves `fmt` as it is."""
    if not fmt.derive:
        return fmt
    probe = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": _PROBE_CONTENT, "reasoning_content": _PROBE_REASONING},
    ]
    try:
        text = render(probe)
    except Exception:  # a template may refuse anything: the format's default stands
        return fmt
    at = text.find(_PROBE_CONTENT)
    r = text.find(_PROBE_REASONING, 0, at) if at >= 0 else -1
    opener = text.rfind(fmt.start, 0, r) if r >= 0 else -1
    closer = text.find(fmt.end, r) if r >= 0 else -1
    if opener < 0 or closer < 0 or closer > at:  # the template drops reasoning: bare tags
        return replace(fmt, space_after="", space_after_start="", trim=False)
    start_space = text[opener + len(fmt.start) : r]
    between = text[closer + len(fmt.end) : at]
    for header in fmt.content_prefixes:
        between = between.replace(header, "")
    return replace(
        fmt,
        space_after=between if not between.strip() else "",
        space_after_start=start_space if not start_space.strip() else "",
        trim=False,
    )


def by_name(name: str) -> ReasoningFormat:
    """The format called `name` (KeyError if none)."""
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise KeyError(name)
