"""`python -m benchmarks interleaved`: N conversations x T turns, round robin, greedy, on one context.

Systems side by side, all with the same n_ctx, threads, n_batch 2048, n_ubatch 512 and flash attention:

- turnstile: a `Runtime` with its default settings (RAM prompt cache, no disk tier), one row per `--cache-rules`
  value (`turnstile`: its lookup rule; `llama-server`: llama-server's prompt cache rules exactly);
- llama-cpp-python: `Llama.create_chat_completion` with no cache (prefix matching against the context only);
- llama-cpp-python + LlamaRAMCache: the same with `llm.set_cache(LlamaRAMCache())`;
- llama-server `-np 1 --cache-ram 8192` when `--llama-server BIN` is given (started and stopped here).

Each system builds every conversation's history from its own replies. "ideal" is the prefill no system can
avoid: per turn, the prompt tokens that no earlier state of that conversation holds, measured on turnstile's
token lists and used for every row. `same_text` counts the replies equal to turnstile's.

    python -m benchmarks interleaved [--conversations 6] [--turns 5] [--max-tokens 48] [--threads 2]
                                     [--llama-server BIN] [--systems turnstile,llama-cpp,llama-cpp-ram,server]
                                     [--cache-rules turnstile,llama-server] [--shared-blocks CELLS]
"""

from __future__ import annotations

from typing import Any

from benchmarks import _cli, _rows, _systems
from benchmarks import _workload as w
from tests.support import workloads

SYSTEMS = ("turnstile", "llama-cpp", "llama-cpp-ram", "server")
LABELS = {
    "turnstile": "turnstile",
    "llama-cpp": "llama-cpp-python (no cache)",
    "llama-cpp-ram": "llama-cpp-python + LlamaRAMCache",
    "server": "llama-server",
}


def factories(
    names: list[str],
    settings: w.Settings,
    binary: str | None,
    server_ram_mib: int,
    variants: list[tuple[str, dict[str, Any]]],
) -> list[tuple[str, w.Factory]]:
    out: list[tuple[str, w.Factory]] = []
    for n in names:
        label = LABELS[n]
        if n == "turnstile":
            for suffix, options in variants:
                out.append((label + suffix, _systems.turnstile_factory(label + suffix, settings, options=options)))
        elif n == "llama-cpp":
            out.append((label, _systems.llama_cpp_factory(label, settings)))
        elif n == "llama-cpp-ram":
            out.append((label, _systems.llama_cpp_factory(label, settings, ram_cache_bytes=2 << 30)))
        elif n == "server" and binary:
            label = f"llama-server -np 1 --cache-ram {server_ram_mib}"
            out.append((label, _systems.server_factory(label, settings, binary, server_ram_mib)))
    return out


def main(argv: list[str]) -> None:
    ap = _cli.parser("interleaved", __doc__)
    _cli.add_common_args(ap, conversations=6, turns=5)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    ap.add_argument("--server-cache-ram", type=int, default=8192, help="llama-server's --cache-ram (MiB)")
    _cli.add_turnstile_args(ap)
    args = ap.parse_args(argv)
    variants = _cli.turnstile_variants(ap, args)
    _cli.check_binary(ap, args.llama_server)
    names = _cli.systems_arg(ap, args.systems, SYSTEMS)
    if names[0] != "turnstile":  # ideal prefill is measured on turnstile's token lists
        names = ["turnstile", *[n for n in names if n != "turnstile"]]
    settings = _cli.settings_from(args)
    turns = workloads.schedule(args.conversations, args.turns)
    rows = _rows.compare_systems(factories(names, settings, args.llama_server, args.server_cache_ram, variants), turns)
    _cli.write(
        "interleaved",
        rows,
        params=_cli.common_params(args, settings)
        | {
            "server_cache_ram_mib": args.server_cache_ram,
            "cache_rules": args.cache_rules,
            "shared_blocks": args.shared_blocks,
        },
        out=args.out,
        columns=_rows.COLUMNS,
    )
