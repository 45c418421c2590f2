"""`turnstile serve`: the Runtime behind an OpenAI-compatible HTTP API (needs the `serve` extra).

Binds 127.0.0.1:8080 unless told otherwise; `--port 0` lets the OS pick a port. Once the model is loaded
it prints `turnstile serve: listening on http://HOST:PORT (model NAME)` and the web page's address
(`turnstile serve: web page at http://HOST:PORT/`) on stdout. The API
key comes from `--api-key` or the TURNSTILE_API_KEY environment variable (which keeps it out of `ps`);
`--api-key-file PATH` gives several keys, each its own tenant (runtime.serve.http.tenants). The key file
is read before the model is loaded: a damaged line stops the command (exit 2) with its line number.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from runtime.api import Runtime
from runtime.cli import cluster, hardware, llama_flags, reasoning
from runtime.config import RuntimeConfig
from runtime.types import CACHE_RULES

DEFAULT_PORT = 8080
API_KEY_ENV = "TURNSTILE_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=None, metavar="PATH", help="a GGUF model (default: SmolLM2-135M)")
    p.add_argument(
        "--host", default="127.0.0.1", help="addresses to bind, comma-separated (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR", help="keep sessions and cached states here")
    p.add_argument("--api-key", default=None, metavar="KEY", help=f"require this bearer token (or set {API_KEY_ENV})")
    p.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="several API keys, one a line as 'NAME: KEY' (or a bare KEY, named keyN after its line); "
        "blank lines and '#' comments are skipped. Each key is a tenant: its sessions are its own. "
        "After the key, SETTING=N words set its quotas (as --quota) and its fair-share weight=N",
    )
    p.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="SETTING=N",
        help="every key's quota (repeatable; a key file line overrides it): sessions, bytes (K/M/G), queued, "
        "rpm, tpm, max_tokens, weight (docs/tenants.md). Over a quota: 429 with Retry-After",
    )
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="CPU threads (default: physical cores)")
    p.add_argument(
        "-c", "--ctx", "--ctx-size", type=int, default=8192, metavar="N", help="context size in tokens (default 8192)"
    )
    p.add_argument("--batch", type=int, default=2048, metavar="N", help="logical batch size (default 2048)")
    p.add_argument("--ubatch", type=int, default=512, metavar="N", help="physical batch size (default 512)")
    p.add_argument(
        "--cache-ram", type=int, default=None, metavar="MIB", help="RAM prompt cache limit (0 off, -1 no limit)"
    )
    p.add_argument("--disk-limit", type=int, default=4096, metavar="MIB", help="disk tier limit (default 4096)")
    p.add_argument("--cache-rules", choices=CACHE_RULES, default="turnstile")
    p.add_argument(
        "--spec", choices=("ngram", "none"), default="none", help="n-gram speculative decoding (default none)"
    )
    p.add_argument(
        "--policy",
        choices=("fifo", "affinity", "fair"),
        default="fifo",
        help="scheduling policy (fifo); fair: a long prefill yields to short turns (docs/fair-slot.md)",
    )
    p.add_argument(
        "--prefill-quantum-ms",
        type=float,
        default=None,
        metavar="MS",
        help="--policy fair: prefill time before a long prompt yields (default 500)",
    )
    p.add_argument(
        "--decode-quantum-ms",
        type=float,
        default=None,
        metavar="MS",
        help="--policy fair: reply time before a generation yields to a waiting turn's first token (100; inf: never)",
    )
    p.add_argument(
        "--prefill-abort-ms",
        type=float,
        default=None,
        metavar="MS",
        help="--policy fair: abort a prefill chunk for a waiting turn unless it ends within this (100; inf: never)",
    )
    p.add_argument(
        "--defer-replies",
        action="store_true",
        help="--policy fair: replies wait while a prompt paused for first tokens waits (it ends near its time alone)",
    )
    p.add_argument("--max-queued", type=int, default=1024, metavar="N", help="queued requests before 429 (1024)")
    p.add_argument("--max-body", type=int, default=8 << 20, metavar="BYTES", help="request body limit (8 MiB)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="per-request time limit (504 after)")
    p.add_argument("--model-name", default=None, metavar="NAME", help="the id /v1/models reports")
    p.add_argument(
        "--no-normalize",
        action="store_true",
        help="give the model volatile prompt spans as sent (Claude Code's billing line, reminders): coding-agents.md",
    )
    p.add_argument(
        "--chat-template-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="a Jinja chat template to use instead of the model's (as llama-server's flag)",
    )
    p.add_argument(
        "--responses-max", type=int, default=10_000, metavar="N", help="stored Responses API responses (10000)"
    )
    p.add_argument(
        "--responses-max-bytes",
        type=int,
        default=256 << 20,
        metavar="BYTES",
        help="stored responses' size limit (256 MiB; in --data-dir/responses when given)",
    )
    reasoning.add_arguments(p)
    llama_flags.add_arguments(p)
    hardware.add_arguments(p)
    p.add_argument("--session-store", default=None, metavar="URL", help="keep sessions in Redis (redis://HOST:PORT/DB)")
    cluster.add_arguments(p)  # --replicas and Ray's options; ray itself is imported only when used
    p.add_argument("--scripted", action="store_true", help=argparse.SUPPRESS)  # benchmarks: no model at all
    p.add_argument("-v", "--verbose", action="count", default=0, help="log info events (-vv: debug) to stderr")


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    limits = (("max_queued", 1), ("max_body", 1), ("responses_max", 1), ("responses_max_bytes", 1))
    for name, low in (("threads", 1), ("ctx", 16), ("batch", 1), ("ubatch", 1), *limits):
        value = getattr(args, name)
        if value is not None and value < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}")
    if not 0 <= args.port <= 65535:
        p.error("--port must be in [0, 65535]")
    if args.timeout is not None and args.timeout <= 0:
        p.error("--timeout must be > 0")
    if args.cache_ram is not None and args.cache_ram < -1:
        p.error("--cache-ram must be >= -1")
    if args.disk_limit < 0:
        p.error("--disk-limit must be >= 0")
    reasoning.check_arguments(p, args)
    llama_flags.check_arguments(p, args)
    hardware.check_arguments(p, args)
    if args.chat_template_file is not None and not args.chat_template_file.is_file():
        p.error(f"--chat-template-file {args.chat_template_file}: no such file")
    args.keyring = None
    if args.api_key_file is not None or args.quota:
        if args.replicas is not None:
            p.error("--api-key-file and --quota do not work with --replicas yet")
        from runtime.errors import InvalidKeyFile
        from runtime.serve.http.quotas import Quotas, parse_settings
        from runtime.serve.http.tenants import Keyring

        try:
            defaults = Quotas().with_settings(parse_settings(args.quota))
            key = args.api_key or os.environ.get(API_KEY_ENV) or None
            args.keyring = Keyring.from_options(key, args.api_key_file, defaults)
        except ValueError as e:  # InvalidConfig, InvalidKeyFile
            p.error(f"--quota: {e}" if not isinstance(e, InvalidKeyFile) else str(e))
    if (args.chat_template_file is not None or args.chat_template is not None) and args.replicas is not None:
        p.error("--chat-template and --chat-template-file do not work with --replicas yet")
    cluster.check_arguments(p, args)


def runtime_config(args: argparse.Namespace, options: dict[str, Any]) -> RuntimeConfig:
    """The one `RuntimeConfig` the flags give (for one Runtime, or for each replica: paths made absolute)."""
    return RuntimeConfig.build(
        model=Path(options["model"]).resolve(),
        data_dir=args.data_dir.resolve() if args.data_dir is not None else None,
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=args.batch,
        n_ubatch=args.ubatch,
        cache_ram_mib=args.cache_ram,
        disk_limit_mib=args.disk_limit,
        cache_rules=args.cache_rules,
        speculative="ngram" if args.spec == "ngram" else None,
        policy=args.policy,
        prefill_quantum_ms=args.prefill_quantum_ms,
        decode_quantum_ms=args.decode_quantum_ms,
        prefill_abort_ms=args.prefill_abort_ms,
        defer_replies=args.defer_replies,
        max_queued=args.max_queued,
        **reasoning.open_keywords(args),
        **hardware.engine_keywords(args),
        **({"chat_template": args.chat_template_file} if args.chat_template_file is not None else {}),
        **({"chat_template": args.chat_template} if args.chat_template is not None else {}),
        **({"pooling": args.pooling} if args.pooling is not None else {}),
    )


def _opener(args: argparse.Namespace, options: dict[str, Any]) -> Any:
    if args.scripted:
        from runtime.testing import ScriptedBackend
        from sessions import MemoryStore

        return lambda: Runtime.serve(
            ScriptedBackend(),
            MemoryStore(),
            policy=args.policy,
            max_queued=args.max_queued,
            prefill_quantum_ms=args.prefill_quantum_ms,
            decode_quantum_ms=args.decode_quantum_ms,
            prefill_abort_ms=args.prefill_abort_ms,
            defer_replies=args.defer_replies,
        )
    config = runtime_config(args, options)

    def open_runtime() -> AbstractAsyncContextManager[Runtime]:
        return Runtime.open(config=config, session_store=args.session_store)

    return open_runtime


async def run(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Serve until SIGTERM or Ctrl-C; 0 after a clean drain."""
    if args.replicas is not None:
        return await cluster.run(args, options, runtime_config(args, options))
    from runtime.serve.http.responses.store import ResponseStore
    from runtime.serve.http.server import serve

    def ready(url: str) -> None:
        sys.stdout.write(f"turnstile serve: listening on {url} (model {name})\n")
        sys.stdout.write(f"turnstile serve: web page at {url}/ (chat, agents room, engine view)\n")
        sys.stdout.flush()

    args.model_name = llama_flags.model_name(args)
    name = args.model_name or ("scripted" if args.scripted else Path(options["model"]).name)
    await serve(
        _opener(args, options),
        host=args.host,
        port=args.port,
        **(
            {"keyring": args.keyring}
            if getattr(args, "keyring", None) is not None
            else {"api_key": args.api_key or os.environ.get(API_KEY_ENV) or None}
        ),
        max_body_bytes=args.max_body,
        request_timeout=args.timeout,
        model_name=args.model_name,
        normalize=not args.no_normalize,
        responses=ResponseStore(
            None if args.data_dir is None else args.data_dir / "responses",
            max_responses=args.responses_max,
            max_bytes=args.responses_max_bytes,
        ),
        llama=llama_flags.options(args),
        on_ready=ready,
    )
    return 0
