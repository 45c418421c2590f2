"""The options of a turn, defined once: the keywords every turn method takes (`chat`, `stream`, `regenerate`,
`edit`, `complete`, `complete_stream`), as `TypedDict`s for `**options: Unpack[...]` (PEP 692).

A type checker completes the keywords and reports a misspelt one; at run time `check_turn_options` splits
what a caller gave into the timeout, the reply's constraints and the sampling overrides, and refuses a
keyword that is none of them (`InvalidSampling`: "not a sampling setting", as before any of this existed),
all before anything is queued.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from runtime.backend.protocol import SlotBackend
from runtime.grammar import ResponseFormat
from runtime.loop import validate as v
from runtime.loop.constraints import Constraints
from runtime.tools import Tool, ToolChoice
from runtime.types import SpeculativeChoice

__all__ = [
    "CONSTRAINT_KEYS",
    "SAMPLING_KEYS",
    "CheckedOptions",
    "SamplingOptions",
    "ToolChoiceArg",
    "ToolsArg",
    "TurnOptions",
    "check_sampling_options",
    "check_turn_options",
]

ToolsArg = Sequence[Tool | Mapping[str, Any] | Callable[..., Any]]
"""Tools a turn offers: OpenAI tool dicts, Python functions (their signatures and docstrings), `Tool`s."""

ToolChoiceArg = str | Mapping[str, Any] | ToolChoice | None
""""auto" (default), "required", "none", a tool's name, or OpenAI's `{"type": "function", "function": {...}}`."""


class SamplingOptions(TypedDict, total=False):
    """Sampling overrides for one turn (the fields of `sessions.Sampling`; absent: the session's own)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    seed: int | None
    max_tokens: int | None
    stop: Sequence[str]
    ignore_eos: bool
    reasoning: str | None  # a thinking model's controls (`runtime.reasoning.options`)
    reasoning_budget: int | None
    reasoning_budget_message: str | None
    chat_template_kwargs: dict[str, Any] | None
    reasoning_format: str | None
    speculative: SpeculativeChoice | None  # n-gram speculation "ngram" (on) or "none" (off); None: the runtime's
    logit_bias: Sequence[tuple[int, float]]  # llama.cpp's other samplers (`sessions.sampler_settings`)
    typical_p: float
    min_keep: int
    top_n_sigma: float
    xtc_probability: float
    xtc_threshold: float
    dynatemp_range: float
    dynatemp_exponent: float
    mirostat: int
    mirostat_tau: float
    mirostat_eta: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: Sequence[str]
    samplers: Sequence[str]
    n_probs: int  # report each generated token's n most probable tokens (`Reply.probs`)
    post_sampling_probs: bool


class TurnOptions(SamplingOptions, total=False):
    """Everything a turn method takes besides what it answers: sampling, constraints and a timeout.

    `response_format` (a msgspec Struct, dataclass or TypedDict type, a JSON-schema dict, or "json") constrains
    the reply to JSON (`reply.parsed`); `grammar` to a GBNF grammar; `tools` lets the model call them
    (`reply.tool_calls`), under `tool_choice`; at most one of the three. `parallel_tool_calls`: True lets a
    reply make several calls, False at most one (grammar and parse), None (the default) one by the grammar.
    `timeout`: seconds from the call until the reply (queueing included); on expiry `RequestTimeout` and
    nothing is committed.
    """

    response_format: ResponseFormat
    grammar: str | None
    tools: ToolsArg | None
    tool_choice: ToolChoiceArg
    parallel_tool_calls: bool | None
    timeout: float | None


SAMPLING_KEYS: frozenset[str] = frozenset(SamplingOptions.__annotations__)
CONSTRAINT_KEYS: frozenset[str] = frozenset(
    {"response_format", "grammar", "tools", "tool_choice", "parallel_tool_calls"}
)


@dataclass(frozen=True)
class CheckedOptions:
    """A turn's options after every check: what the scheduler, the turn and the sampler need."""

    timeout: float | None
    sampling: dict[str, Any]
    constraints: Constraints


def check_sampling_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling overrides, each checked against `Sampling` (`InvalidSampling` otherwise)."""
    return v.check_sampling(dict(options))


def check_turn_options(options: Mapping[str, Any], backend: SlotBackend) -> CheckedOptions:
    """Split and check a turn's options: the timeout, the sampling overrides (any keyword that is neither a
    constraint nor the timeout must be a sampling setting), then the constraints, built against `backend`."""
    timeout = v.check_timeout(options.get("timeout"))
    sampling = check_sampling_options(
        {k: value for k, value in options.items() if k not in CONSTRAINT_KEYS and k != "timeout"}
    )
    constraints = Constraints.build(
        response_format=options.get("response_format"),
        grammar=options.get("grammar"),
        tools=options.get("tools"),
        tool_choice=options.get("tool_choice", "auto"),
        parallel_tool_calls=options.get("parallel_tool_calls"),
        tool_format=backend.tool_format,
        generation_prompt=backend.generation_prompt,
        check_grammar=backend.check_grammar,
        reasoning_format=backend.reasoning_format,
    )
    return CheckedOptions(timeout, sampling, constraints)
