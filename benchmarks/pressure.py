"""`python -m benchmarks pressure`: the interleaved workload with a RAM prompt cache that holds about a third of it.

SmolLM2-135M keeps 22.5 KiB of K and V per token, so a 16 MiB RAM cache holds two or three of six
conversations' states once they are a few turns long: the others are evicted and, without a disk tier,
recomputed when their conversation speaks again. Systems (same context settings as `interleaved`):

- turnstile, RAM cache 16 MiB, no disk tier;
- turnstile, RAM cache 16 MiB + disk tier (each row its own data_dir in a temporary directory);

each turnstile system once per `--cache-rules` value (default both: `turnstile`, `llama-server`).
- llama-server `-np 1 --cache-ram 16` when `--llama-server BIN` is given.

Columns as in `interleaved`; "ideal" is measured on the first turnstile run's token lists.

    python -m benchmarks pressure [--cache-ram 16] [--conversations 6] [--turns 5] [--llama-server BIN]
                                  [--systems turnstile,turnstile-disk,server,llama-cpp-ram]
                                  [--cache-rules turnstile,llama-server] [--shared-blocks CELLS]
                                  [--cache-type f16,q8_0]

`--cache-type f16,q8_0`: one group of rows per K/V cache type (llama-server run with the same `-ctk/-ctv`);
"same_text" compares each row with the group's first. A q8_0 state is about 53 % of an f16 one (34 bytes
per 32 values against 64), so the same RAM holds about twice the states ("ram_states" at the end of the run).
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks import _cli, _rows, _systems
from benchmarks import _workload as w
from tests.support import workloads

SYSTEMS = ("turnstile", "turnstile-disk", "server", "llama-cpp-ram")
DEFAULT_SYSTEMS = ("turnstile", "turnstile-disk", "server")


def main(argv: list[str]) -> None:
    ap = _cli.parser("pressure", __doc__)
    _cli.add_common_args(ap, conversations=6, turns=5)
    ap.add_argument("--cache-ram", type=int, default=16, help="the RAM prompt cache limit of every system (MiB)")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    _cli.add_turnstile_args(ap)
    args = ap.parse_args(argv)
    variants = _cli.turnstile_variants(ap, args)
    _cli.check_binary(ap, args.llama_server)
    names = _cli.systems_arg(ap, args.systems, SYSTEMS)
    if not names[0].startswith("turnstile"):  # ideal prefill is measured on turnstile's token lists
        names = ["turnstile", *names]
    mib = args.cache_ram
    turns = workloads.schedule(args.conversations, args.turns)
    rows: list[dict[str, Any]] = []
    types = _cli.cache_types(args)
    with _cli.temp_dir("turnstile-pressure-") as tmp:
        for cache_type in types:  # one group per KV type: its texts are compared within the group
            settings = _cli.settings_from(args, cache_type)
            kv = f", KV {cache_type}" if len(types) > 1 or cache_type != "f16" else ""
            systems: list[tuple[str, w.Factory]] = []
            for n in names:
                if n in ("turnstile", "turnstile-disk"):
                    for k, (suffix, options) in enumerate(variants):
                        disk = n == "turnstile-disk"
                        label = f"turnstile, RAM {mib} MiB{' + disk' if disk else ''}{kv}{suffix}"
                        data_dir = os.path.join(tmp, f"{n}-{k}-{cache_type}") if disk else None
                        factory = _systems.turnstile_factory(
                            label, settings, cache_ram_mib=mib, data_dir=data_dir, options=options
                        )
                        systems.append((label, factory))
                elif n == "server" and args.llama_server:
                    label = f"llama-server --cache-ram {mib}{' -ctk/-ctv ' + cache_type if kv else ''}"
                    systems.append((label, _systems.server_factory(label, settings, args.llama_server, mib)))
                elif n == "llama-cpp-ram":
                    label = f"llama-cpp-python + LlamaRAMCache({mib} MiB){kv}"
                    systems.append((label, _systems.llama_cpp_factory(label, settings, ram_cache_bytes=mib << 20)))
            for row in _rows.compare_systems(systems, turns):
                slot = row.get("turnstile_stats", {}).get("slot", {})
                row["ram_states"] = slot.get("ram_entries", "-")
                row["ram_mib"] = round(slot["ram_bytes"] / 2**20, 1) if "ram_bytes" in slot else "-"
                rows.append(row)
    _cli.write(
        "pressure",
        rows,
        params=_cli.common_params(args, _cli.settings_from(args, types[0]))
        | {"cache_ram_mib": mib, "cache_rules": args.cache_rules, "shared_blocks": args.shared_blocks},
        out=args.out,
        columns=[*_rows.COLUMNS, "ram_states", "ram_mib"],
    )
