"""`python -m benchmarks pressure`: the interleaved workload with a RAM prompt cache that holds about a third of it.

SmolLM2-135M keeps 22.5 KiB of K and V per token, so a 16 MiB RAM cache holds two or three of six
conversations' states once they are a few turns long: the others are evicted and, without a disk tier,
recomputed when their conversation speaks again. Systems (same context settings as `interleaved`):

- turnstile, RAM cache 16 MiB, no disk tier;
- turnstile, RAM cache 16 MiB + disk tier (data_dir in a temporary directory);
- llama-server `-np 1 --cache-ram 16` when `--llama-server BIN` is given.

Columns as in `interleaved`; "ideal" is measured on the first turnstile run's token lists.

    python -m benchmarks pressure [--cache-ram 16] [--conversations 6] [--turns 5] [--llama-server BIN]
                                  [--systems turnstile,turnstile-disk,server,llama-cpp-ram]
"""

from __future__ import annotations

from benchmarks import _workload as w

SYSTEMS = ("turnstile", "turnstile-disk", "server", "llama-cpp-ram")
DEFAULT_SYSTEMS = ("turnstile", "turnstile-disk", "server")


def main(argv: list[str]) -> None:
    ap = w.parser("pressure", __doc__)
    w.add_common_args(ap, conversations=6, turns=5)
    ap.add_argument("--cache-ram", type=int, default=16, help="the RAM prompt cache limit of every system (MiB)")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    args = ap.parse_args(argv)
    w.check_binary(ap, args.llama_server)
    names = w.systems_arg(ap, args.systems, SYSTEMS)
    if not names[0].startswith("turnstile"):  # ideal prefill is measured on turnstile's token lists
        names = ["turnstile", *names]
    settings = w.settings_from(args)
    mib = args.cache_ram
    turns = w.schedule(args.conversations, args.turns)
    with w.temp_dir("turnstile-pressure-") as tmp:
        systems: list[tuple[str, w.Factory]] = []
        for n in names:
            if n == "turnstile":
                label = f"turnstile, RAM {mib} MiB"
                systems.append((label, w.turnstile_factory(label, settings, cache_ram_mib=mib)))
            elif n == "turnstile-disk":
                label = f"turnstile, RAM {mib} MiB + disk"
                systems.append((label, w.turnstile_factory(label, settings, cache_ram_mib=mib, data_dir=tmp)))
            elif n == "server" and args.llama_server:
                label = f"llama-server --cache-ram {mib}"
                systems.append((label, w.server_factory(label, settings, args.llama_server, mib)))
            elif n == "llama-cpp-ram":
                label = f"llama-cpp-python + LlamaRAMCache({mib} MiB)"
                systems.append((label, w.llama_cpp_factory(label, settings, ram_cache_bytes=mib << 20)))
        rows = w.compare_systems(systems, turns)
    w.write(
        "pressure",
        rows,
        params=w.common_params(args, settings) | {"cache_ram_mib": mib},
        out=args.out,
        columns=w.COLUMNS,
    )
