"""`python -m benchmarks restart`: conversations that outlive a restart of the process that serves them.

Phase 1 plays `--turns` turns of each conversation round robin; then the system is closed and opened
again (turnstile: the same `data_dir`, so its sessions and the disk tier survive; llama-server: stopped
and started, so its RAM prompt cache is gone) and phase 2 plays `--after` more turns. The table shows
each phase's tokens prefilled against the ideal (prompt tokens no earlier state of the conversation
holds, measured on turnstile's token lists and carried across the restart), and how long reopening took.

turnstile runs once per `--cache-rules` value (default both), each in its own data_dir.

    python -m benchmarks restart [--conversations 6] [--turns 2] [--after 2] [--llama-server BIN]
                                 [--cache-rules turnstile,llama-server] [--shared-blocks CELLS]
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks import _cli, _rows, _systems
from benchmarks import _workload as w
from tests.support import workloads

COLUMNS = [
    "system",
    "phase",
    "turns",
    "prompt_tokens",
    "prefilled",
    "ideal",
    "prefilled_per_ideal",
    "wall_s",
    "gen_tok_s",
    "open_s",
    "same_text",
]


def main(argv: list[str]) -> None:
    ap = _cli.parser("restart", __doc__)
    _cli.add_common_args(ap, conversations=6, turns=2)
    ap.add_argument("--after", type=int, default=2, help="turns per conversation after the restart")
    ap.add_argument("--cache-ram", type=int, default=None, help="RAM cache MiB (default: llama-server's, 8192)")
    _cli.add_turnstile_args(ap)
    args = ap.parse_args(argv)
    variants = _cli.turnstile_variants(ap, args)
    _cli.check_binary(ap, args.llama_server)
    before = args.turns  # turns per conversation before the restart
    settings = _cli.settings_from(args)
    phase1 = workloads.schedule(args.conversations, before)
    phase2 = workloads.schedule(args.conversations, args.after, first_turn=before)
    rows: list[dict[str, Any]] = []
    ideal: dict[tuple[int, int], int] = {}
    ref: list[w.TurnRecord] | None = None
    with _cli.temp_dir("turnstile-restart-") as tmp:
        for k, (suffix, options) in enumerate(variants):
            # the same data_dir twice; the driver's token lists carry the ideal across the restart
            label = "turnstile + disk" + suffix
            data_dir = os.path.join(tmp, f"turnstile-{k}")
            convs = w.Conversations()
            _cli.progress(f"{label}: {len(phase1)} turns, restart, {len(phase2)} turns")
            ts1 = _systems.TurnstileSystem(
                label, settings, data_dir=data_dir, cache_ram_mib=args.cache_ram, options=options
            )
            try:
                rec1 = w.play(ts1, phase1, convs)
                states = ts1.states
            finally:
                ts1.close()
            open1 = ts1.open_seconds
            t0 = time.perf_counter()
            ts2 = _systems.TurnstileSystem(
                label, settings, data_dir=data_dir, cache_ram_mib=args.cache_ram, options=options
            )
            open2 = time.perf_counter() - t0
            try:
                ts2.remember(states)
                rec2 = w.play(ts2, phase2, convs)
                stats = ts2.stats()
            finally:
                ts2.close()
            if ref is None:  # the first variant measures the ideal and gives the reference texts
                ideal = _rows.ideal_of([*rec1, *rec2])
                ref, first = [*rec1, *rec2], None
            else:
                first = ref
            rows.append(_row(label, "before", rec1, ideal, first, open1))
            rows.append(_row(label, "after restart", rec2, ideal, first, open2) | {"turnstile_stats": stats})

        if args.llama_server:
            mib = args.cache_ram if args.cache_ram is not None else 8192
            label = f"llama-server --cache-ram {mib}"
            convs = w.Conversations()
            _cli.progress(f"{label}: {len(phase1)} turns, restart, {len(phase2)} turns")
            results: list[tuple[list[w.TurnRecord], float]] = []
            for phase in (phase1, phase2):
                t0 = time.perf_counter()
                with w.opened(_systems.server_factory(label, settings, args.llama_server, mib)) as srv:
                    opened = time.perf_counter() - t0
                    results.append((w.play(srv, phase, convs), opened))
            assert ref is not None
            rows.append(_row(label, "before", results[0][0], ideal, ref, results[0][1]))
            rows.append(_row(label, "after restart", results[1][0], ideal, ref, results[1][1]))
    _cli.write(
        "restart",
        rows,
        params=_cli.common_params(args, settings)
        | {
            "before": before,
            "after": args.after,
            "cache_ram_mib": args.cache_ram,
            "cache_rules": args.cache_rules,
            "shared_blocks": args.shared_blocks,
        },
        out=args.out,
        columns=COLUMNS,
    )


def _row(
    label: str,
    phase: str,
    records: list[w.TurnRecord],
    ideal: dict[tuple[int, int], int],
    reference: list[w.TurnRecord] | None,
    open_s: float,
) -> dict[str, Any]:
    row = _rows.summarize(label, records, ideal, reference)
    return {"system": label, "phase": phase, **row, "open_s": round(open_s, 3), "per_turn": _rows.per_turn(records)}
