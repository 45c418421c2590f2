"""What the chat benchmarks' tables say about a run: one row per system (token totals, prefill against the
ideal, wall time, generation rate, agreement with the reference texts), the per-turn records for the JSON,
`compare_systems` (the same turns on each system in turn) and nearest-rank percentiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks._cli import progress
from benchmarks._systems import TurnstileSystem
from benchmarks._workload import Conversations, Factory, TurnRecord, opened, play

__all__ = ["COLUMNS", "compare_systems", "ideal_of", "per_turn", "percentile", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


COLUMNS = [
    "system",
    "turns",
    "prompt_tokens",
    "prefilled",
    "ideal",
    "prefilled_per_ideal",
    "wall_s",
    "gen_tok_s",
    "wall_ratio",
    "same_text",
]


def ideal_of(records: Sequence[TurnRecord]) -> dict[tuple[int, int], int]:
    """Each turn's ideal prefill, from a turnstile run's records."""
    out: dict[tuple[int, int], int] = {}
    for r in records:
        if r.outcome.ideal is None:
            raise ValueError("ideal prefill is measured on a turnstile run")
        out[r.conv, r.turn] = r.outcome.ideal
    return out


def summarize(
    name: str,
    records: Sequence[TurnRecord],
    ideal: dict[tuple[int, int], int],
    reference: Sequence[TurnRecord] | None = None,
    first_wall: float | None = None,
) -> dict[str, Any]:
    """One table row: token totals, prefill against ideal, wall time, generation rate, text agreement."""
    prefilled = sum(r.outcome.prefilled for r in records)
    ideal_n = sum(ideal[r.conv, r.turn] for r in records)
    wall = sum(r.seconds for r in records)
    generated = sum(r.outcome.generated for r in records)
    row: dict[str, Any] = {
        "system": name,
        "turns": len(records),
        "prompt_tokens": sum(r.outcome.prompt_tokens for r in records),
        "prefilled": prefilled,
        "ideal": ideal_n,
        "prefilled_per_ideal": round(prefilled / ideal_n, 3) if ideal_n else 0.0,
        "wall_s": round(wall, 3),
        "gen_tok_s": round(generated / wall, 1) if wall else 0.0,
        "wall_ratio": round(wall / first_wall, 3) if first_wall else 1.0,
        "same_text": "-",
        "generated": generated,
    }
    if reference is not None:
        ref = {(r.conv, r.turn): r.outcome.text for r in reference}
        same = sum(ref.get((r.conv, r.turn)) == r.outcome.text for r in records)
        row["same_text"] = f"{same}/{len(records)}"
    return row


def per_turn(records: Sequence[TurnRecord]) -> list[dict[str, Any]]:
    """The records as JSON-friendly dicts (for the benchmark's JSON, not its table)."""
    return [
        {
            "conv": r.conv,
            "turn": r.turn,
            "prompt_tokens": r.outcome.prompt_tokens,
            "prefilled": r.outcome.prefilled,
            "generated": r.outcome.generated,
            "ideal": r.outcome.ideal,
            "seconds": round(r.seconds, 4),
        }
        for r in records
    ]


def compare_systems(systems: Sequence[tuple[str, Factory]], turns: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """Play the same turns on each system in turn; the first must be turnstile (it measures the ideal)."""
    rows: list[dict[str, Any]] = []
    ideal: dict[tuple[int, int], int] = {}
    reference: list[TurnRecord] = []
    first_wall: float | None = None
    for label, make in systems:
        progress(f"{label}: {len(turns)} turns")
        with opened(make) as system:
            records = play(system, turns, Conversations())
            stats = system.stats() if isinstance(system, TurnstileSystem) else None
        if not ideal:
            ideal, reference = ideal_of(records), records
        row = summarize(label, records, ideal, None if records is reference else reference, first_wall)
        first_wall = first_wall or row["wall_s"]
        if stats is not None:
            row["turnstile_stats"] = stats
        rows.append(row | {"per_turn": per_turn(records)})
    return rows
