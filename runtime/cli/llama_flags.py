"""`turnstile serve`'s flags that exist for llama-server's command line: the server's sampling defaults
(`--temp`, `--seed`, `--n-predict`), `--slots` / `--no-slots` (GET /slots on or off), `--slot-save-path`,
`--cors-origins`, `--chat-template NAME` (one of llama.cpp's built-in templates), `--embedding`,
`--reranking` and `--pooling`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from runtime.serve.http.llama.options import LlamaOptions

__all__ = ["add_arguments", "check_arguments", "model_name", "options", "sampling_defaults"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=float, default=None, metavar="T", help="default temperature (0.8)")
    p.add_argument("--seed", type=int, default=None, metavar="N", help="default seed (-1 or none: random)")
    p.add_argument("--n-predict", type=int, default=None, metavar="N", help="default tokens to generate (-1: no limit)")
    p.add_argument("--slots", dest="slots", action="store_true", default=True, help="serve GET /slots (default)")
    p.add_argument("--no-slots", dest="slots", action="store_false", help="answer GET /slots with 501")
    p.add_argument("--metrics", dest="metrics", action="store_true", default=True, help="serve GET /metrics (default)")
    p.add_argument("--no-metrics", dest="metrics", action="store_false", help="answer GET /metrics with 501")
    p.add_argument(
        "--slot-save-path", default=None, metavar="DIR", help="where POST /slots/0?action=save writes (llama-server's)"
    )
    p.add_argument(
        "--alias", default=None, metavar="LIST", help="the model's names, comma-separated (its id: the first sorted)"
    )
    p.add_argument("--tags", default=None, metavar="LIST", help="tags /v1/models lists, comma-separated")
    p.add_argument(
        "--embedding",
        "--embeddings",
        dest="embedding",
        action="store_true",
        help="serve /embedding(s) and /v1/embeddings from a second context on the model (llama-server's)",
    )
    p.add_argument(
        "--reranking",
        "--rerank",
        dest="reranking",
        action="store_true",
        help="serve /rerank (and the embedding routes) with rank pooling (llama-server's)",
    )
    p.add_argument(
        "--pooling",
        choices=("none", "mean", "cls", "last", "rank"),
        default=None,
        help="the embeddings' pooling (default: the model's)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|JINJA",
        help="one of llama.cpp's built-in template names (chatml, llama3, command-r, ...) or Jinja source",
    )
    p.add_argument(
        "--cors-origins",
        default=None,
        metavar="LIST",
        help="origins browsers may call from, comma-separated ('*': any); none by default",
    )


def _list(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def model_name(args: argparse.Namespace) -> str | None:
    """--model-name, else the first of --alias's names in sorted order (llama-server's id), else None."""
    aliases = sorted(_list(args.alias))
    return args.model_name or (aliases[0] if aliases else None)


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.reranking:  # as llama-server's flag: embeddings on, rank pooling
        if args.pooling not in (None, "rank"):
            p.error("--reranking uses rank pooling: leave --pooling out")
        args.pooling = "rank"
    if args.chat_template is not None:
        from runtime.errors import InvalidConfig
        from runtime.templates.load import chat_template_source

        if getattr(args, "chat_template_file", None) is not None:
            p.error("give --chat-template or --chat-template-file, not both")
        try:
            args.chat_template = chat_template_source(args.chat_template)
        except InvalidConfig as e:
            p.error(f"--chat-template: {e}")
    if args.temp is not None and not 0.0 <= args.temp <= 100.0:
        p.error("--temp must be in [0, 100]")
    if args.n_predict is not None and args.n_predict < -1:
        p.error("--n-predict must be -1 (no limit) or a number of tokens")


def sampling_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling values a request gets when it does not give its own."""
    out: dict[str, Any] = {}
    if args.temp is not None:
        out["temperature"] = args.temp
    if args.seed is not None and args.seed >= 0:
        out["seed"] = args.seed
    if args.n_predict is not None and args.n_predict >= 0:
        out["max_tokens"] = args.n_predict
    return out


def options(args: argparse.Namespace) -> LlamaOptions:
    origins = _list(args.cors_origins)
    return LlamaOptions(
        aliases=_list(args.alias),
        tags=_list(args.tags),
        sampling=sampling_defaults(args),
        slots=args.slots,
        metrics=args.metrics,
        slot_save_path=Path(args.slot_save_path) if args.slot_save_path else None,
        cors_origins=origins,
        embeddings=args.embedding or args.reranking,
        reranking=args.reranking,
    )
