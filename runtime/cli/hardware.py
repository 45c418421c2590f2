"""llama-server's hardware flags on `turnstile serve`, `chat` and `demo`, with its names and meanings:
GPU layers, KV cache types, flash attention, mmap/mlock, and where the model comes from (`-hf`).

`-t/--threads` and `-c/--ctx-size` are aliases of the commands' own `--threads` and `--ctx`. Every value is
checked by building the `EngineConfig` it makes (the same checks `Runtime.open` runs), so a combination
llama.cpp would refuse (a quantized V cache without flash attention) stops the command before the model loads.
"""

from __future__ import annotations

import argparse
from typing import Any

from runtime.config import FLASH_ATTN_NAMES, KV_TYPES, EngineConfig
from runtime.errors import InvalidConfig

__all__ = ["add_arguments", "check_arguments", "engine_keywords", "gpu_layers"]


def gpu_layers(value: str) -> int:
    """`-ngl`'s value: a count, or "all"/"auto" (every layer: turnstile does not fit layers to free memory)."""
    if value in ("all", "auto"):
        return -1
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of layers, 'all' or 'auto', not {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (or 'all')")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and hardware (llama-server's flags)")
    g.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        dest="n_gpu_layers",
        type=gpu_layers,
        default=0,
        metavar="N",
        help="layers to offload to the GPU: a number, or 'all' (default 0; a CPU-only build offloads none)",
    )
    kv = ", ".join(KV_TYPES)
    g.add_argument(
        "-ctk", "--cache-type-k", dest="type_k", choices=KV_TYPES, default="f16", metavar="TYPE", help=f"K cache: {kv}"
    )
    g.add_argument(
        "-ctv",
        "--cache-type-v",
        dest="type_v",
        choices=KV_TYPES,
        default="f16",
        metavar="TYPE",
        help="V cache type (a quantized one needs flash attention); states record both types",
    )
    g.add_argument(
        "-fa",
        "--flash-attn",
        dest="flash_attn",
        choices=FLASH_ATTN_NAMES,
        default="on",
        help="flash attention (default on, which keeps answers equal to llama-server's -fa on)",
    )
    g.add_argument("--no-mmap", dest="use_mmap", action="store_false", help="read the model into memory, no mmap")
    g.add_argument("--mlock", dest="use_mlock", action="store_true", help="keep the model in RAM (no swapping)")
    g.add_argument(
        "-hf",
        "--hf-repo",
        dest="hf_repo",
        default=None,
        metavar="ORG/REPO[:QUANT]",
        help="download a GGUF from a Hugging Face repo (QUANT default Q4_K_M, else Q8_0, else the first); "
        "needs the `hub` extra; HF_TOKEN, HF_HUB_OFFLINE and the hub's cache apply",
    )
    g.add_argument("--hf-file", default=None, metavar="NAME", help="the file to take from --hf-repo (overrides QUANT)")


def engine_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """`Runtime.open`'s engine keywords from the flags."""
    return {
        "n_gpu_layers": args.n_gpu_layers,
        "type_k": args.type_k,
        "type_v": args.type_v,
        "flash_attn": FLASH_ATTN_NAMES[args.flash_attn],
        "use_mmap": args.use_mmap,
        "use_mlock": args.use_mlock,
    }


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop with a usage error for a combination the engine would refuse, before anything loads."""
    if args.hf_repo is not None and args.model is not None:
        p.error("--model and -hf/--hf-repo are two sources for the model: give one")
    if args.hf_file is not None and args.hf_repo is None:
        p.error("--hf-file needs -hf/--hf-repo")
    if args.hf_repo is not None:
        from runtime.llama.hub import parse_repo

        try:
            parse_repo(args.hf_repo)
        except InvalidConfig as e:
            p.error(str(e))
    try:
        EngineConfig(**engine_keywords(args))
    except InvalidConfig as e:
        p.error(str(e))
