"""Settings that are plain data, validated when they are built: the engine's context settings.

No llama.cpp here: `Runtime.open` checks a configuration before it loads anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from runtime.errors import InvalidConfig
from runtime.templates.load import chat_template_source

__all__ = ["KV_TYPES", "EngineConfig"]

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
"""K/V cache types by name, with their ggml type ids."""


@dataclass(frozen=True)
class EngineConfig:
    """Context settings. Defaults are llama-server's where they change the numbers."""

    n_ctx: int = 8192
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None  # None: physical cores, as llama-server
    n_threads_batch: int | None = None  # None: same as n_threads
    flash_attn: bool = True
    swa_full: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    n_gpu_layers: int = 0
    use_mmap: bool = True
    chat_template: str | os.PathLike[str] | None = None  # Jinja source or a template file (None: the GGUF's)

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            if getattr(self, name) < 1:
                raise InvalidConfig(f"{name} must be at least 1")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise InvalidConfig(f"{name} must be one of {sorted(KV_TYPES)}")
        if self.chat_template is not None:
            chat_template_source(self.chat_template)  # Jinja source, or a file that can be read

    def settings_key(self) -> str:
        """The context settings a saved state depends on (part of every stored state's header)."""
        return (
            f"n_ctx={self.n_ctx};n_batch={self.n_batch};n_ubatch={self.n_ubatch};fa={int(self.flash_attn)};"
            f"swa_full={int(self.swa_full)};type_k={self.type_k};type_v={self.type_v}"
        )
