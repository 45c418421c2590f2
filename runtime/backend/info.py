"""What a backend runs on: the model and the hardware settings it was opened with, as `/v1/models` (its
`meta`) and llama-server's `/props`-style model info report them."""

from __future__ import annotations

import msgspec

__all__ = ["EngineInfo"]


class EngineInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The model a backend runs and where: `n_gpu_layers` is what was offloaded (0 on a build without a GPU
    backend, whatever was asked: `n_gpu_layers_requested`); `type_k`/`type_v` the KV cache types, which every
    stored state records; `flash_attn` "on", "off" or "auto"."""

    model: str
    n_ctx: int
    n_layer: int = 0
    n_gpu_layers: int = 0
    n_gpu_layers_requested: int = 0
    gpu_offload: bool = False  # whether this llama.cpp build can offload to a GPU at all
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "on"
    use_mmap: bool = True
    use_mlock: bool = False
    n_threads: int = 0
