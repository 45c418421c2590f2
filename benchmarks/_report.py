"""Print a benchmark's rows as a table and write them, with the run's context, as JSON."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(os.environ.get("TURNSTILE_BENCH_DIR", "bench-results"))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render rows as a plain aligned text table."""
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    head = "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join([head, sep, *body])


def emit(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    params: Mapping[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    out: Path | None = None,
) -> Path:
    """Print the table and write `bench-results/NAME.json`; returns the JSON path."""
    print(f"\n== {name} ==")
    if params:
        print("  " + ", ".join(f"{k}={v}" for k, v in params.items()))
    print(table(rows, columns))
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "params": dict(params or {}),
        "rows": [dict(r) for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2))
    print(f"  -> {path}")
    return path
