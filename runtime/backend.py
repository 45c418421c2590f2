"""What the Runtime needs from the slot side (`SlotBackend`), the request and result it passes, and the
llama.cpp implementation (`LlamaBackend`: an engine, its chat template, the slot and its tiered cache).

`runtime.testing.ScriptedBackend` is the other implementation: scripted replies and gates, no model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import llama_cpp

from caches.disk_tier import DiskTier, DiskTierStats
from caches.tiered import Location
from runtime.chat_template import RenderedChat
from runtime.prompt import PromptRenderer
from runtime.sampler import GrammarSpec, init_grammar
from runtime.tools import ToolFormat
from runtime.types import CacheSource, FinishReason
from sessions import Sampling

__all__ = ["LlamaBackend", "SlotBackend", "SlotRequest", "SlotResult"]


@dataclass
class SlotRequest:
    """One completion for the slot: a tokenized prompt and how to generate."""

    prompt: Sequence[int]
    sampling: Sampling = field(default_factory=Sampling)  # max_tokens None: until the context is full
    user_starts: Sequence[int] = ()  # token index of each user message (checkpoint boundaries)
    reserve: bool = False  # refuse a prompt that leaves no room for max_tokens
    cancel: Callable[[], bool] = lambda: False
    on_piece: Callable[[str], None] | None = None
    request_id: int = 0
    session_id: str = ""
    grammar: GrammarSpec | None = None  # constrains decoding (structured output, tool calls)


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

    @property
    def generated_tokens(self) -> int:
        return len(self.tokens)


class SlotBackend(Protocol):
    """The slot side of a Runtime. `prepare`, `run` and `close` run in the one worker thread;
    `locate`, `state_key`, `stats` and `disk_stats` are read on the event loop between requests."""

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

    def generation_prompt(self) -> str:
        """What the chat template appends for the assistant's turn."""
        ...

    def check_grammar(self, spec: GrammarSpec) -> None:
        """Raise InvalidRequest unless the grammar parses (read-only on the vocabulary: any thread)."""
        ...

    def run(self, req: SlotRequest) -> SlotResult:
        """Run one request on the slot; raises ContextOverflow (nothing changed) or DecodeError."""
        ...

    def state_key(self) -> int:
        """A key for what the slot holds now (read right after `run`, for the affinity policy)."""
        ...

    def locate(self, key: int) -> Location:
        """Where a state with this key is, if not in the slot: RAM, disk or none."""
        ...

    def stats(self) -> Any:
        """The slot's counters (`SlotStats` for `LlamaBackend`)."""
        ...

    def disk_stats(self) -> DiskTierStats | None: ...

    def close(self) -> None:
        """Write what should survive to the disk tier and free everything."""
        ...


class LlamaBackend:
    """The real backend: an `Engine`, its `Slot` (with the tiered cache) and the optional disk tier."""

    def __init__(self, engine: Any, slot: Any, disk: DiskTier | None = None) -> None:
        self.engine = engine
        self.slot = slot
        self.disk = disk
        self.n_ctx: int = engine.n_ctx
        self.name: str = engine.path.name
        self._generation_prompt: str | None = None
        self.prompts = PromptRenderer(engine.template, lambda text, special: engine.tokenize(text, add_special=special))

    def prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        session_id: str | None = None,
        *,
        spans: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedChat:
        spans = spans or self.engine.needs_checkpoints
        if tools is not None or template_kwargs:  # the incremental renderer knows no template variables
            rendered: RenderedChat = self.engine.render(
                messages, spans=spans, tools=tools, template_kwargs=template_kwargs
            )
            return rendered
        return self.prompts.render(messages, session_id, spans=spans)

    def tool_format(self) -> ToolFormat:
        fmt: ToolFormat = self.engine.template.tool_format()
        return fmt

    def check_grammar(self, spec: GrammarSpec) -> None:
        llama_cpp.llama_sampler_free(init_grammar(self.engine, spec))

    def generation_prompt(self) -> str:
        """The template's generation prompt if its tokens spell it exactly (then a grammar can start with it
        and be fed those tokens, as llama-server does); else "" (the grammar starts at the reply)."""
        if self._generation_prompt is None:  # a property of the model: worked out once
            eng = self.engine
            prompt: str = eng.template.generation_prompt()
            tokens = eng.tokenize(prompt, add_special=False, parse_special=True)
            spelled = b"".join(eng.token_to_piece(t, special=True) for t in tokens).decode("utf-8", "replace")
            self._generation_prompt = prompt if spelled == prompt else ""
        return self._generation_prompt

    def run(self, req: SlotRequest) -> SlotResult:
        result: SlotResult = self.slot.run(req)
        return result

    def state_key(self) -> int:
        return hash(tuple(self.slot.tokens))

    def locate(self, key: int) -> Location:
        where: Location = self.slot.cache.where(key)
        return where

    def stats(self) -> Any:
        return self.slot.stats()

    def disk_stats(self) -> DiskTierStats | None:
        return self.disk.stats() if self.disk is not None else None

    def close(self) -> None:
        try:
            self.slot.flush()
        finally:
            if self.disk is not None:
                self.disk.close()
            self.engine.close()
