"""What the Runtime needs from the slot side (`SlotBackend`) and the data that crosses between the two:
the request and result, the grammar a request carries, a rendered chat and the slot's counters
(`SlotStats`). No llama.cpp here.

`runtime.backend.llama.LlamaBackend` is the real implementation (an engine, its chat template, the slot and
its tiered cache); `runtime.testing.ScriptedBackend` the other one: scripted replies and gates, no model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from caches.disk.stats import DiskTierStats
from caches.tiered import Location
from runtime.backend.info import EngineInfo
from runtime.errors import TurnstileError
from runtime.reasoning import BudgetSpec, ReasoningFormat
from runtime.tools import ToolFormat
from runtime.types import CacheSource, FinishReason
from sessions import Sampling

__all__ = [
    "EngineInfo",
    "GrammarSpec",
    "PrefillPaused",
    "RenderedChat",
    "SlotBackend",
    "SlotRequest",
    "SlotResult",
    "SlotStats",
]


@dataclass(frozen=True)
class GrammarSpec:
    """A GBNF grammar for one request: data the sampler consumes (the slot knows nothing of its meaning)."""

    gbnf: str
    lazy: bool = False  # applies only from a trigger on (tool-call openers), so plain text is unconstrained
    trigger_patterns: tuple[str, ...] = ()  # regexes (llama.cpp's lazy grammar patterns)
    trigger_tokens: tuple[int, ...] = ()
    prefill: str = ""  # text fed to the grammar before generation (not for lazy grammars)


@dataclass(frozen=True)
class RenderedChat:
    """A chat rendered with the model's template and tokenized, with where each message starts."""

    text: str
    tokens: list[int]
    message_starts: list[int]  # token index where message i starts (same order as the messages)
    roles: list[str] = field(default_factory=list)

    @property
    def user_starts(self) -> list[int]:
        return [p for p, r in zip(self.message_starts, self.roles, strict=True) if r == "user"]


@dataclass
class SlotRequest:
    """One completion for the slot: a tokenized prompt and how to generate."""

    prompt: Sequence[int]
    sampling: Sampling = field(default_factory=Sampling)  # max_tokens None: until the context is full
    user_starts: Sequence[int] = ()  # token index of each user message (checkpoint boundaries)
    reserve: bool = False  # refuse a prompt that leaves no room for max_tokens
    cancel: Callable[[], bool] = lambda: False
    on_piece: Callable[[str], None] | None = None
    on_start: Callable[[int, int], None] | None = None  # (prompt, cached tokens) once it fits, before prefill
    on_prefill: Callable[[int, int], None] | None = None  # (prompt tokens in the slot, prompt tokens): progress
    request_id: int = 0
    session_id: str = ""
    grammar: GrammarSpec | None = None  # constrains decoding (structured output, tool calls)
    speculative: bool | None = None  # n-gram speculation for this request; None: the slot's setting
    budget: BudgetSpec | None = None  # a reasoning budget: its closer is forced when spent
    preserved: tuple[str, ...] = ()  # special tokens detokenized as their text (a reasoning format's tags)
    # asked between two n_batch chunks of the prefill with (tokens in the slot, prompt tokens): True stops the
    # prefill there (`PrefillPaused`); the scheduler's preemption check (`runtime.loop.fair`)
    pause: Callable[[int, int], bool] | None = None
    resumed: bool = False  # a paused request run again: the slot does not count it as a new request


class PrefillPaused(TurnstileError):
    """The slot stopped a prefill at an n_batch boundary because `SlotRequest.pause` said so. The slot holds the
    prompt's first `done` tokens, a state like any other (the next swap saves it, the lookup rule finds it);
    the scheduler queues the request again in its place. A signal, not an error: it never reaches a caller."""

    def __init__(self, done: int, total: int, cached: int, prefilled: int, t_prefill: float, source: CacheSource):
        super().__init__(f"prefill paused at {done} of {total} tokens")
        self.done = done  # prompt tokens the slot holds
        self.total = total
        self.cached = cached  # tokens this run found cached
        self.prefilled = prefilled  # tokens this run evaluated
        self.t_prefill = t_prefill
        self.source: CacheSource = source


@dataclass(frozen=True)
class SlotResult:
    """What a request did: its text and where every token came from."""

    text: str
    finish_reason: FinishReason
    tokens: list[int]  # generated tokens (an end-of-generation token included)
    prompt_tokens: int
    cached_tokens: int  # llama-server's cache_n
    prefilled_tokens: int  # llama-server's prompt_n
    cache_source: CacheSource
    bytes_saved: int
    bytes_restored: int
    t_cache: float
    t_prefill: float
    t_decode: float
    t_first_token: float | None  # seconds from start to the first generated token
    dropped_messages: int = 0  # messages of the conversation the prompt left out (context "window")
    draft_n: int = 0  # tokens drafted by n-gram speculation (llama-server's draft_n)
    draft_n_accepted: int = 0  # of those, accepted
    stop_sequence: str | None = None  # the stop string that ended it (finish "stop"), None for EOS or another end

    @property
    def generated_tokens(self) -> int:
        return len(self.tokens)


class SlotStats(msgspec.Struct, frozen=True, kw_only=True):
    """A backend's counters since it was made (a snapshot): tokens, where reused states came from, and
    what its caches hold now. A backend without a cache tier reports 0 for it."""

    requests: int
    prompt_tokens: int
    cached_tokens: int  # llama-server's cache_n, summed
    prefilled_tokens: int  # llama-server's prompt_n, summed
    generated_tokens: int
    swaps: int  # prompt cache updates that replaced the slot's state
    ram_loads: int
    disk_loads: int
    checkpoint_restores: int
    checkpoints: int
    slot_tokens: int
    ram_entries: int
    ram_bytes: int
    ram_held_bytes: int = 0  # what RAM actually holds: ram_bytes, or less with shared blocks
    draft_n: int = 0  # tokens drafted by n-gram speculation (llama-server's draft_n)
    draft_n_accepted: int = 0


class SlotBackend(Protocol):
    """The slot side of a Runtime. `prepare`, `run`, `settle` and `close` run in the one worker thread;
    `locate`, `state_key`, `stats` and `disk_stats` are read on the event loop at any time, also while a
    request runs: they read counters in memory, never do I/O and never wait for the worker."""

    n_ctx: int
    name: str  # what it runs (the model file's name), for logs, the CLI and /v1/models

    def prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        session_id: str | None = None,
        *,
        spans: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedChat:
        """Render and tokenize a conversation with every message's start (`spans=False`: only if cheap, or
        if the slot's checkpoints need them); `session_id` keeps the result for the session's next turn.
        `tools` and `template_kwargs` go to the chat template (a turn that offers tools)."""
        ...

    def tool_format(self) -> ToolFormat:
        """How this model's chat template offers tools and writes calls."""
        ...

    def apply_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text the chat template gives (llama-server's /apply-template; pure: any thread)."""
        ...

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """The model's tokens for a text (read-only on the vocabulary: any thread)."""
        ...

    def token_piece(self, token: int) -> bytes:
        """A token's bytes, special tokens spelled out; InvalidRequest for an id outside the vocabulary."""
        ...

    def generation_prompt(self) -> str:
        """What the chat template appends for the assistant's turn."""
        ...

    def check_grammar(self, spec: GrammarSpec) -> None:
        """Raise InvalidRequest unless the grammar parses (read-only on the vocabulary: any thread)."""
        ...

    def reasoning_format(self) -> ReasoningFormat | None:
        """How this model's chat template writes reasoning (None: it knows none)."""
        ...

    def run(self, req: SlotRequest) -> SlotResult:
        """Run one request on the slot; raises ContextOverflow (nothing changed) or LlamaDecodeError."""
        ...

    def settle(self) -> None:
        """Finish the last run's bookkeeping that can wait until its reply is out (the worker calls it when
        idle; `run` and `close` do it first anyway)."""
        ...

    def state_key(self) -> int:
        """A key for what the slot holds now (read right after `run`, for the affinity policy)."""
        ...

    def locate(self, key: int) -> Location:
        """Where a state with this key is, if not in the slot: RAM, disk or none."""
        ...

    def stats(self) -> SlotStats:
        """The slot's counters."""
        ...

    def disk_stats(self) -> DiskTierStats | None:
        """The disk tier's counters (`DiskTier.stats`, which never waits for a write), or None without one."""
        ...

    def engine_info(self) -> EngineInfo:
        """The model and the hardware settings it runs with (read from memory, at any time)."""
        ...

    def set_key_weights(self, weight: Callable[[str], int]) -> None:
        """The API keys' weights by session namespace, for the cache tiers' shares (`caches.shares`)."""
        ...

    def close(self) -> None:
        """Write what should survive to the disk tier and free everything."""
        ...
