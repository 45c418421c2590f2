"""What the Runtime needs from the slot side (`SlotBackend`) and the data that crosses between the two:
the request and result, the grammar a request carries, a rendered chat and the slot's counters
(`SlotStats`). No llama.cpp here.

`runtime.backend.llama.LlamaBackend` is the real implementation (an engine, its chat template, the slot and
its tiered cache); `runtime.testing.ScriptedBackend` the other one: scripted replies and gates, no model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from caches.disk.stats import DiskTierStats
from caches.tiered import Location
from runtime.backend.info import EngineInfo
from runtime.errors import TurnstileError
from runtime.reasoning import BudgetSpec, ReasoningFormat
from runtime.reply import TokenProb
from runtime.tools import ToolFormat
from runtime.types import CacheSource, FinishReason
from sessions import Sampling

__all__ = [
    "Carry",
    "ChunkWatch",
    "DecodePaused",
    "Embeddings",
    "EngineInfo",
    "GrammarSpec",
    "PrefillPaused",
    "RenderedChat",
    "SlotBackend",
    "SlotFile",
    "SlotFiles",
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


@dataclass(frozen=True)
class RenderOptions:
    """How `SlotBackend.prepare` renders: with every message's start (`spans=False`: only if cheap, or if the
    slot's checkpoints need them), and what goes to the chat template: `tools` and `template_kwargs` (a turn
    that offers tools, reasoning controls)."""

    spans: bool = True
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] | None = None

    def kwargs(self) -> dict[str, Any]:
        """As the renderers' keyword arguments."""
        return {"spans": self.spans, "tools": self.tools, "template_kwargs": self.template_kwargs}


WHOLE = RenderOptions()
"""Every message's start, no tools, no extra template variables."""


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
    # asked after each generated token with the number generated: True stops the generation there (`DecodePaused`)
    pause_decode: Callable[[int], bool] | None = None
    carry: Carry | None = None  # a generation paused in its decode (`DecodePaused.carry`): it goes on from there
    # a prefill that may also stop inside a chunk: the slot reports each chunk to it and, while the chunk runs,
    # llama.cpp's abort check stops it from `chunks.at` on (`PrefillPaused.aborted_tokens`); only where the
    # memory can drop the aborted chunk exactly (a transformer's KV cache), never during a generation
    chunks: ChunkWatch | None = None


class ChunkWatch(Protocol):
    """A running prefill's chunks as its scheduler sees them (`SlotRequest.chunks`), called on the slot's thread."""

    # perf_counter time from which the running chunk is aborted (inf: never); llama.cpp's abort check reads it
    # after every graph node, so it is a plain attribute
    at: float

    def started(self, done: int, total: int, tokens: int) -> None:
        """A chunk of `tokens` prompt tokens starts now, with `done` of `total` in the slot."""
        ...

    def ended(self, ok: bool) -> None:
        """The chunk ended: evaluated (`ok`), or aborted (for a pause or a cancel)."""
        ...


class PrefillPaused(TurnstileError):
    """The slot stopped a prefill at an n_batch boundary because `SlotRequest.pause` said so (or inside a chunk,
    from `SlotRequest.chunks.at` on: that chunk's tokens are dropped again, `aborted_tokens` evaluated for
    nothing in `aborted_s`). The slot holds the prompt's first `done` tokens, a state like any other (the next
    swap saves it, the lookup rule finds it); the scheduler queues the request again in its place. A signal, not
    an error: it never reaches a caller."""

    def __init__(
        self,
        done: int,
        total: int,
        cached: int,
        prefilled: int,
        t_prefill: float,
        source: CacheSource,
        *,
        aborted_tokens: int = 0,
        aborted_s: float = 0.0,
    ):
        super().__init__(f"prefill paused at {done} of {total} tokens")
        self.aborted_tokens = aborted_tokens  # tokens of the aborted chunk whose evaluation was thrown away
        self.aborted_s = aborted_s  # seconds that work took (part of t_prefill)
        self.done = done  # prompt tokens the slot holds
        self.total = total
        self.cached = cached  # tokens this run found cached
        self.prefilled = prefilled  # tokens this run evaluated
        self.t_prefill = t_prefill
        self.t_decode = 0.0  # seconds this run decoded (a paused generation's)
        self.source: CacheSource = source


class Carry(Protocol):
    """A paused generation the slot goes on with (opaque here); `close` frees it when it will not run again."""

    def close(self) -> None: ...


class DecodePaused(PrefillPaused):
    """The slot stopped a generation after a token because `SlotRequest.pause_decode` said so: the slot holds the
    prompt and the tokens generated so far but the last (`done` tokens), the last one is emitted and waits to be
    evaluated. `carry` is the generation (its sampler, detokenizer, stop matcher): the request's next run passes
    it back as `SlotRequest.carry` and goes on exactly where it stopped; `close` it if the request is dropped."""

    def __init__(
        self,
        done: int,
        total: int,
        cached: int,
        prefilled: int,
        t_prefill: float,
        source: CacheSource,
        *,
        generated: int,
        t_decode: float,
        carry: Carry,
    ):
        super().__init__(done, total, cached, prefilled, t_prefill, source)
        self.args = (f"generation paused after {generated} tokens",)
        self.generated = generated  # tokens generated so far (the pending one included)
        self.t_decode = t_decode
        self.carry = carry

    def close(self) -> None:
        self.carry.close()


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
    probs: tuple[TokenProb, ...] = ()  # each generated token's probabilities (`Sampling.n_probs` > 0)

    @property
    def generated_tokens(self) -> int:
        return len(self.tokens)


class SlotStats(msgspec.Struct, frozen=True, kw_only=True):
    """A backend's counters since it was made (a snapshot): tokens, where reused states came from, and
    what its caches hold now. A backend without a cache tier reports 0 for it (every count defaults to 0)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # llama-server's cache_n, summed
    prefilled_tokens: int = 0  # llama-server's prompt_n, summed
    generated_tokens: int = 0
    swaps: int = 0  # prompt cache updates that replaced the slot's state
    ram_loads: int = 0
    disk_loads: int = 0
    checkpoint_restores: int = 0
    checkpoints: int = 0
    slot_tokens: int = 0
    ram_entries: int = 0
    ram_bytes: int = 0
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
        self, messages: Sequence[Mapping[str, Any]], session_id: str | None = None, options: RenderOptions = WHOLE
    ) -> RenderedChat:
        """Render and tokenize a conversation as `options` say; `session_id` keeps the result for the
        session's next turn."""
        ...

    def tool_format(self) -> ToolFormat:
        """How this model's chat template offers tools and writes calls."""
        ...

    def apply_template(
        self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = WHOLE, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text the chat template gives with `options`' tools and variables (llama-server's
        /apply-template; pure: any thread)."""
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


@dataclass(frozen=True)
class SlotFile:
    """What a slot save or restore did (llama-server's `n_saved` / `n_restored` and `n_written` / `n_read`)."""

    n_tokens: int
    n_bytes: int


@runtime_checkable
class SlotFiles(Protocol):
    """A backend whose slot can be written to a file and read back (llama-server's slot actions); run in the
    worker thread, between requests."""

    def save_slot(self, path: Path) -> SlotFile:
        """Write what the slot holds (tokens, state, checkpoints) to `path`."""
        ...

    def restore_slot(self, path: Path) -> SlotFile:
        """Keep the slot's state in the cache, then load `path` into the slot; StateFormatError (the slot
        unchanged) for a file this model and settings cannot use."""
        ...

    def erase_slot(self) -> int:
        """Forget what the slot holds; the number of tokens it held."""
        ...


@runtime_checkable
class Embeddings(Protocol):
    """A backend that can embed token lists in a context of its own (llama-server's `--embedding`); run in
    the worker thread. The chat slot's state is never touched."""

    def embed(self, inputs: Sequence[Sequence[int]], normalize: int) -> list[list[list[float]]]:
        """Per input: [one vector] when the pooling pools (normalized as llama.cpp's `embd_normalize`), else
        one vector per token."""
        ...

    def embedding_pooling(self) -> str:
        """The pooling the embedding context uses (none, mean, cls, last, rank; opens the context)."""
        ...

    def rerank(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        """Each input's score (the first value of its `rank`-pooled output)."""
        ...
