"""The llama.cpp backend: an `Engine`, its chat template, the `Slot` (with the tiered cache) and the optional
disk tier, behind the `SlotBackend` protocol; `LlamaBackend.build` makes one from a checked `RuntimeConfig`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from caches.disk.stats import DiskTierStats
from caches.disk.tier import DiskBlocks, DiskTier
from caches.kvstate import memory_of
from caches.shares import Weights
from caches.tiered import Location
from runtime.backend.info import EngineInfo
from runtime.backend.protocol import (
    WHOLE,
    GrammarSpec,
    RenderedChat,
    RenderOptions,
    SlotFile,
    SlotRequest,
    SlotResult,
    SlotStats,
)
from runtime.config import RuntimeConfig
from runtime.errors import DiskTierUnavailable, InvalidRequest
from runtime.llama.embedder import Embedder
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path
from runtime.llama.prompt import PromptRenderer
from runtime.llama.sampler import check_grammar
from runtime.log import get_logger
from runtime.reasoning import ReasoningFormat, detect, with_template
from runtime.slot import files as slot_files
from runtime.slot.executor import Slot
from runtime.tools import ToolFormat

__all__ = ["LlamaBackend"]

log = get_logger(__name__)


class LlamaBackend:
    """The real backend: an `Engine`, its `Slot` (with the tiered cache) and the optional disk tier."""

    def __init__(self, engine: Any, slot: Any, disk: DiskTier | None = None) -> None:
        self.engine = engine
        self.slot = slot
        self.disk = disk
        self.n_ctx: int = engine.n_ctx
        self.name: str = engine.path.name
        self._generation_prompt: str | None = None
        self._reasoning: tuple[ReasoningFormat | None] | None = None
        self.embedder = Embedder(engine, engine.config.pooling)  # its context is made on the first embed
        self.prompts = PromptRenderer(engine.template, lambda text, special: engine.tokenize(text, add_special=special))

    @classmethod
    def build(cls, config: RuntimeConfig) -> LlamaBackend:
        """Load the model, open the disk tier (`data_dir/states`, when there is a data_dir; one that cannot be
        opened is logged and left out, the documented fallback) and make the slot. Blocking: run it in a worker
        thread. What it made is freed again if a later step fails."""
        engine = Engine(config.model if config.model is not None else default_model_path(), config.engine)
        cache, disk, weights = config.cache, None, Weights()
        try:
            if config.data_dir is not None:
                directory = config.data_dir / "states"
                try:
                    disk = DiskTier(
                        directory,
                        fingerprint=engine.fingerprint,
                        settings=engine.settings_key,
                        limit_bytes=cache.disk_limit_bytes,
                        # shared blocks on disk too: part 1 of `SlotState.parts()` is the sequence state
                        blocks=None
                        if cache.shared_blocks is None
                        else DiskBlocks(memory_of(str(engine.kind), engine.n_swa), cache.shared_blocks, part=1),
                        weights=weights,
                    )
                except DiskTierUnavailable as e:
                    log.warning("runtime.disk_tier_unavailable", directory=e.directory, reason=e.reason)
            slot = Slot(
                engine,
                cache_ram_bytes=cache.ram_limit,
                disk=disk,
                cache_rules=cache.rules,
                speculative=config.speculative,
                shared_blocks=cache.shared_blocks,
                weights=weights,
            )
        except BaseException:
            try:
                if disk is not None:
                    disk.close()
            finally:
                engine.close()
            raise
        return cls(engine, slot, disk)

    def prepare(
        self, messages: Sequence[Mapping[str, Any]], session_id: str | None = None, options: RenderOptions = WHOLE
    ) -> RenderedChat:
        kw = options.kwargs() | {"spans": options.spans or self.engine.needs_checkpoints}
        if session_id is None and (options.tools is not None or options.template_kwargs):  # one full render
            rendered: RenderedChat = self.engine.render(messages, **kw)
            return rendered
        return self.prompts.render(messages, session_id, **kw)

    def tool_format(self) -> ToolFormat:
        fmt: ToolFormat = self.engine.template.tool_format()
        return fmt

    def check_grammar(self, spec: GrammarSpec) -> None:
        check_grammar(self.engine, spec)

    def apply_template(
        self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = WHOLE, add_generation_prompt: bool = True
    ) -> str:
        text: str = self.engine.template.render_text(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=options.tools,
            template_kwargs=options.template_kwargs,
        )
        return text

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        tokens: list[int] = self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)
        return tokens

    def token_piece(self, token: int) -> bytes:
        if not 0 <= token < self.engine.n_vocab:
            raise InvalidRequest(f"token {token} is not in the vocabulary (0 to {self.engine.n_vocab - 1})")
        piece: bytes = self.engine.token_to_piece(token, special=True)
        return piece

    def reasoning_format(self) -> ReasoningFormat | None:
        """The template's reasoning format, with the whitespace it writes after the closer (worked out once)."""
        if self._reasoning is None:
            fmt = detect(self.engine.template.source)
            template = self.engine.template

            def render(messages: list[dict[str, Any]]) -> str:
                kwargs = {"enable_thinking": True} if fmt is not None and fmt.switch else None
                return str(template.render_text(messages, add_generation_prompt=False, template_kwargs=kwargs))

            self._reasoning = (with_template(fmt, render) if fmt is not None else None,)
        return self._reasoning[0]

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

    def settle(self) -> None:
        self.slot.settle()

    def embed(self, inputs: Sequence[Sequence[int]], normalize: int) -> list[list[list[float]]]:
        return [self.embedder.embed(tokens, normalize) for tokens in inputs]

    def rerank(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        return [self.embedder.score(tokens) for tokens in inputs]

    def embedding_pooling(self) -> str:
        self.embedder.pooled()
        return self.embedder.pooling_name

    def save_slot(self, path: Path) -> SlotFile:
        return slot_files.save(self.slot, path)

    def restore_slot(self, path: Path) -> SlotFile:
        return slot_files.restore(self.slot, path)

    def erase_slot(self) -> int:
        return slot_files.erase(self.slot)

    def set_key_weights(self, weight: Callable[[str], int]) -> None:
        self.slot.weights.set(weight)  # the disk tier shares the slot's `Weights` (`build`)

    def state_key(self) -> int:
        return hash(tuple(self.slot.last.tokens(self.slot.tokens)))  # what a cache tier saves it under

    def locate(self, key: int) -> Location:
        where: Location = self.slot.cache.where(key)
        return where

    def stats(self) -> SlotStats:
        stats: SlotStats = self.slot.stats()
        return stats

    def disk_stats(self) -> DiskTierStats | None:
        return self.disk.stats() if self.disk is not None else None

    def engine_info(self) -> EngineInfo:
        eng, cfg = self.engine, self.engine.config
        return EngineInfo(
            model=self.name,
            n_ctx=self.n_ctx,
            n_layer=eng.n_layer,
            n_gpu_layers=eng.n_gpu_layers,
            n_gpu_layers_requested=cfg.n_gpu_layers,
            gpu_offload=eng.gpu_offload,
            type_k=cfg.type_k,
            type_v=cfg.type_v,
            flash_attn=cfg.flash_attn_name,
            use_mmap=cfg.use_mmap,
            use_mlock=cfg.use_mlock,
            n_threads=eng.n_threads,
        )

    def close(self) -> None:
        try:
            self.slot.flush()
        finally:
            if self.disk is not None:
                self.disk.close()
            self.embedder.close()  # its context before the model it was made on
            self.engine.close()
