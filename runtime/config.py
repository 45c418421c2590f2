"""Settings that are plain data, validated once, when they are built: the engine's context settings
(`EngineConfig`) and everything a Runtime is opened with (`RuntimeConfig`).

No llama.cpp here: `Runtime.open` builds a `RuntimeConfig` (every `InvalidConfig` is raised then) before it
loads or creates anything; the llama backend is built from it (`LlamaBackend.build`) and the Runtime reads
its loop settings from it, neither checks anything again.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

from caches.prompt_cache import default_limit_bytes
from runtime.errors import InvalidConfig
from runtime.loop.policy import POLICIES, Policy
from runtime.reasoning import ReasoningOptions
from runtime.templates.load import chat_template_source
from runtime.types import CACHE_RULES, SPECULATIVE, CacheRules, Speculative
from sessions.model import CONTEXT_POLICIES, ContextPolicy

__all__ = [
    "FLASH_ATTN_NAMES",
    "KV_TYPES",
    "QUANTIZED_KV",
    "EngineConfig",
    "EngineOptions",
    "FlashAttn",
    "LoopOptions",
    "RuntimeConfig",
]

KV_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
"""K/V cache types by name (llama-server's `-ctk/-ctv` values, in its order), with their ggml type ids."""

QUANTIZED_KV = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})
"""The block-quantized K/V types: a quantized V cache needs flash attention, and each needs a head size that is
a multiple of its block (32 values); llama.cpp refuses the context otherwise."""

FlashAttn = bool | Literal["auto"]
"""Flash attention: True (llama-server's `-fa on`), False (`off`) or "auto" (llama.cpp decides per device)."""

FLASH_ATTN_NAMES: dict[str, FlashAttn] = {"on": True, "off": False, "auto": "auto"}


@dataclass(frozen=True)
class EngineConfig:
    """Context settings. Defaults are llama-server's where they change the numbers."""

    n_ctx: int = 8192
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None  # None: physical cores, as llama-server
    n_threads_batch: int | None = None  # None: same as n_threads
    flash_attn: FlashAttn = True  # True, False or "auto" ("on"/"off" are read as True/False)
    swa_full: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    n_gpu_layers: int = 0  # layers offloaded to the GPU; -1: all of them (a CPU build offloads none)
    use_mmap: bool = True
    use_mlock: bool = False  # keep the model's pages in RAM (llama-server's --mlock)
    chat_template: str | os.PathLike[str] | None = None  # Jinja source or a template file (None: the GGUF's)

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            if getattr(self, name) < 1:
                raise InvalidConfig(f"{name} must be at least 1")
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
        if not _is_int(self.n_gpu_layers) or self.n_gpu_layers < -1:
            raise InvalidConfig(f"n_gpu_layers must be an int >= 0, or -1 for all layers, not {self.n_gpu_layers!r}")
        if self.chat_template is not None:
            chat_template_source(self.chat_template)  # Jinja source, or a file that can be read

    @classmethod
    def from_options(cls, n_ctx: int, n_threads: int | None, options: Mapping[str, Any]) -> EngineConfig:
        """From `Runtime.open`'s engine keywords (`EngineOptions`); `InvalidConfig` for a name that is not one."""
        unknown = set(options) - _ENGINE_OPTIONS
        if unknown:
            raise InvalidConfig(f"unknown engine options {sorted(unknown)}; known: {sorted(_ENGINE_OPTIONS)}")
        return cls(n_ctx=n_ctx, n_threads=n_threads, **options)

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


class EngineOptions(TypedDict, total=False):
    """`Runtime.open`'s engine keywords besides n_ctx and n_threads (the other `EngineConfig` fields)."""

    n_batch: int
    n_ubatch: int
    n_threads_batch: int | None
    flash_attn: FlashAttn | str  # True/"on", False/"off" or "auto"
    swa_full: bool
    type_k: str
    type_v: str
    n_gpu_layers: int
    use_mmap: bool
    use_mlock: bool
    chat_template: str | os.PathLike[str] | None  # Jinja source or a .jinja file instead of the GGUF's


_ENGINE_OPTIONS = frozenset(EngineOptions.__annotations__)


class LoopOptions(TypedDict, total=False):
    """The settings of the Runtime's own loop (`Runtime.serve`'s keywords): see `RuntimeConfig`."""

    policy: str | Policy
    max_queued: int
    context: ContextPolicy
    reasoning: ReasoningOptions | None  # None: the config's


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything a Runtime runs with, checked in `__post_init__` (`InvalidConfig`), so a value of this class
    is always valid. See `Runtime.open` for what each setting means.

    `ram_limit` is derived when the config is built: the RAM prompt cache's byte limit in `PromptCache`'s
    convention (None: no RAM cache, 0: no limit), from `cache_ram_mib` (None: llama-server's rule, 8192 MiB
    but at most a quarter of the memory available now; 0: off; -1: no limit).
    """

    model: Path | None = None  # None: the default model
    data_dir: Path | None = None  # None: sessions in memory, no disk tier
    engine: EngineConfig = field(default_factory=EngineConfig)
    cache_ram_mib: int | None = None
    disk_limit_mib: int = 4096
    cache_rules: CacheRules = "turnstile"
    policy: str | Policy = "fifo"
    max_queued: int = 1024
    context: ContextPolicy = "error"
    speculative: Speculative = None  # "ngram": draft-less speculative decoding in the slot
    shared_blocks: int | None = None  # the RAM cache holds states as blocks of this many cells, each kept once
    reasoning: ReasoningOptions = field(default_factory=ReasoningOptions)  # every turn's default controls
    ram_limit: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("model", "data_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                raise InvalidConfig(f"{name} must be a Path or None, not {value!r}")
        if not isinstance(self.engine, EngineConfig):
            raise InvalidConfig(f"engine must be an EngineConfig, not {self.engine!r}")
        ram = self.cache_ram_mib
        if ram is not None and (not _is_int(ram) or ram < -1):
            raise InvalidConfig(f"cache_ram_mib must be None, -1, 0 or a positive int, not {ram!r}")
        if not _is_int(self.disk_limit_mib) or self.disk_limit_mib < 0:
            raise InvalidConfig(f"disk_limit_mib must be an int >= 0 (0: no limit), not {self.disk_limit_mib!r}")
        if self.cache_rules not in CACHE_RULES:
            raise InvalidConfig(f"cache_rules must be 'turnstile' or 'llama-server', not {self.cache_rules!r}")
        if isinstance(self.policy, str) and self.policy not in POLICIES:
            raise InvalidConfig(f"unknown policy {self.policy!r}; choose one of {sorted(POLICIES)}")
        if not _is_int(self.max_queued) or self.max_queued < 1:
            raise InvalidConfig(f"max_queued must be an int >= 1, not {self.max_queued!r}")
        if self.context not in CONTEXT_POLICIES:
            raise InvalidConfig(f"context must be one of {CONTEXT_POLICIES}, not {self.context!r}")
        if not isinstance(self.reasoning, ReasoningOptions):
            raise InvalidConfig(
                f"reasoning must be ReasoningOptions (runtime.api.reasoning_options), not {self.reasoning!r}"
            )
        if self.shared_blocks is not None and (not _is_int(self.shared_blocks) or self.shared_blocks < 1):
            raise InvalidConfig(
                f"shared_blocks must be None or an int >= 1 (cells a block), not {self.shared_blocks!r}"
            )
        if self.speculative not in SPECULATIVE:
            raise InvalidConfig(f"speculative must be 'ngram' or None, not {self.speculative!r}")
        if self.speculative is not None and self.cache_rules == "llama-server":
            raise InvalidConfig("speculative='ngram' needs cache_rules='turnstile' (llama-server's rules keep it off)")
        limit = default_limit_bytes() if ram is None else None if ram == 0 else 0 if ram < 0 else ram << 20
        object.__setattr__(self, "ram_limit", limit)

    @property
    def disk_limit_bytes(self) -> int:
        return self.disk_limit_mib << 20

    def with_loop(self, **options: Unpack[LoopOptions]) -> RuntimeConfig:
        """This config with other loop settings, checked like the rest."""
        given: dict[str, Any] = {k: value for k, value in options.items() if not (k == "reasoning" and value is None)}
        return dataclasses.replace(self, **given) if given else self
