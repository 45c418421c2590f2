"""The llama.cpp backend: an `Engine`, its chat template, the `Slot` (with the tiered cache) and the optional
disk tier, behind the `SlotBackend` protocol."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from caches.disk.stats import DiskTierStats
from caches.disk.tier import DiskTier
from caches.tiered import Location
from runtime.backend.protocol import GrammarSpec, RenderedChat, SlotRequest, SlotResult, SlotStats
from runtime.llama.prompt import PromptRenderer
from runtime.llama.sampler import check_grammar
from runtime.tools import ToolFormat

__all__ = ["LlamaBackend"]


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
        check_grammar(self.engine, spec)

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

    def stats(self) -> SlotStats:
        stats: SlotStats = self.slot.stats()
        return stats

    def disk_stats(self) -> DiskTierStats | None:
        return self.disk.stats() if self.disk is not None else None

    def close(self) -> None:
        try:
            self.slot.flush()
        finally:
            if self.disk is not None:
                self.disk.close()
            self.engine.close()
