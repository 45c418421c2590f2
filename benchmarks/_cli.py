"""The benchmarks' command-line plumbing: argument parsers with the options the chat benchmarks share, the
run's settings and JSON params from them, checks that end in a usage error, progress lines, and writing a
benchmark's table and JSON (`benchmarks._report`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from benchmarks._report import RESULTS_DIR, emit
from benchmarks._workload import N_BATCH, N_CTX, N_UBATCH, SEED, Settings
from runtime.llama.models import default_model_path

__all__ = [
    "add_common_args",
    "add_turnstile_args",
    "cache_types",
    "check_binary",
    "common_params",
    "out_path",
    "parser",
    "progress",
    "settings_from",
    "systems_arg",
    "temp_dir",
    "turnstile_variants",
    "write",
]


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_common_args(ap: argparse.ArgumentParser, *, conversations: int, turns: int) -> None:
    ap.add_argument("--conversations", type=int, default=conversations, help="conversations played round robin")
    ap.add_argument("--turns", type=int, default=turns, help="turns per conversation")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens generated per turn at most (greedy)")
    ap.add_argument("--n-ctx", type=int, default=N_CTX)
    ap.add_argument("--threads", type=int, default=2, help="threads for every system (prefill and decode)")
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=None, metavar="BIN", help="a llama-server binary to compare with")
    ap.add_argument(
        "--cache-type", default="f16", metavar="TYPE", help="K and V cache type of every system (-ctk/-ctv): f16, q8_0"
    )
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, metavar="N", help="GPU layers of every system")
    ap.add_argument("--out", default=None, metavar="DIR", help=f"where to write NAME.json (default: {RESULTS_DIR})")


RULES = ("turnstile", "llama-server")


def add_turnstile_args(ap: argparse.ArgumentParser) -> None:
    """`--cache-rules` (one turnstile row per rule) and `--shared-blocks`."""
    ap.add_argument(
        "--cache-rules",
        default=",".join(RULES),
        help="comma-separated: one turnstile row per Runtime cache_rules value (default: both)",
    )
    ap.add_argument("--shared-blocks", type=int, default=None, metavar="CELLS", help="Runtime shared_blocks")


def turnstile_variants(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(label suffix, Runtime.open options) for each `--cache-rules` value, the suffix empty for the default."""
    out: list[tuple[str, dict[str, Any]]] = []
    blocks = f", blocks {args.shared_blocks}" if args.shared_blocks else ""
    for rule in systems_arg(ap, args.cache_rules, RULES):
        options: dict[str, Any] = {"cache_rules": rule}
        if args.shared_blocks:
            options["shared_blocks"] = args.shared_blocks
        out.append((f" [{rule} rules{blocks}]", options))
    return out


def settings_from(args: argparse.Namespace, cache_type: str | None = None) -> Settings:
    """The run's settings; `cache_type` None: the one `--cache-type` names (a usage error if it names several)."""
    model = Path(args.model) if args.model else default_model_path()
    types = cache_types(args)
    if cache_type is None and len(types) > 1:
        raise SystemExit(f"--cache-type: this benchmark takes one type, not {','.join(types)!r}")
    return Settings(
        model=model,
        n_ctx=args.n_ctx,
        threads=args.threads,
        max_tokens=args.max_tokens,
        seed=SEED,
        cache_type=cache_type or types[0],
        n_gpu_layers=getattr(args, "n_gpu_layers", 0),  # a benchmark whose parser has no hardware options
    )


def cache_types(args: argparse.Namespace) -> list[str]:
    """`--cache-type`, a comma-separated list, each one checked."""
    from runtime.config import KV_TYPES

    types = [t for t in getattr(args, "cache_type", "f16").split(",") if t]  # absent: the parser has no --cache-type
    bad = [t for t in types if t not in KV_TYPES]
    if bad or not types:
        raise SystemExit(f"--cache-type: unknown {bad}; choose from {', '.join(KV_TYPES)}")
    return types


def common_params(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """The run's settings, for the JSON's params."""
    return {
        "model": settings.model.name,
        "conversations": args.conversations,
        "turns": args.turns,
        "max_tokens": settings.max_tokens,
        "n_ctx": settings.n_ctx,
        "threads": settings.threads,
        "n_batch": N_BATCH,
        "n_ubatch": N_UBATCH,
        "flash_attn": True,
        "cache_type": settings.cache_type,
        "n_gpu_layers": settings.n_gpu_layers,
        "seed": settings.seed,
        "llama_server": args.llama_server,
    }


def systems_arg(ap: argparse.ArgumentParser, value: str, allowed: Sequence[str]) -> list[str]:
    """The comma-separated `--systems` value, each one checked against `allowed`."""
    names = [s for s in value.split(",") if s]
    bad = [s for s in names if s not in allowed]
    if bad or not names:
        ap.error(f"unknown systems {bad}; choose from {', '.join(allowed)}")
    return names


def check_binary(ap: argparse.ArgumentParser, binary: str | None) -> None:
    if binary and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        ap.error(f"--llama-server {binary!r} is not an executable file")


def out_path(out: str | None, name: str) -> Path | None:
    return Path(out) / f"{name}.json" if out else None


def write(
    name: str,
    rows: Sequence[dict[str, Any]],
    *,
    params: dict[str, Any],
    out: str | None,
    columns: Sequence[str] | None = None,
) -> Path:
    return emit(name, rows, params=params, columns=columns, out=out_path(out, name))


def temp_dir(prefix: str) -> AbstractContextManager[str]:
    return tempfile.TemporaryDirectory(prefix=prefix)


def progress(msg: str) -> None:
    print(f"  .. {msg}", flush=True)
