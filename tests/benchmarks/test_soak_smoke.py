"""Smoke test: `python -m benchmarks soak` end to end on the scripted backend for a few seconds: it writes its
JSON, and the run it reports has no 5xx, no lost acknowledged turn and no cross-talk (the scripted backend
replays exactly; the per-token check, which needs a model, is tests/benchmarks/test_crosstalk.py)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import soak


def test_soak_runs_and_finds_nothing_wrong(tmp_path: Path) -> None:
    soak.main(["--scripted", "--minutes", "0.1", "--clients", "6", "--keys", "2", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "soak.json").read_text())
    rows = {r["what"]: r["value"] for r in doc["rows"]}
    assert rows["acknowledged turns"] > 0
    assert rows["5xx"] == 0
    assert rows["replay alone gives other text (information: rounding or a leak)"] == 0
    assert not any(w.startswith("cross-talk check") for w in rows)  # the token check needs a model
    checked, lost = (int(x) for x in rows["conversations checked / lost or changed"].split(" / "))
    assert checked >= 4 and lost == 0
    assert {"start", "middle", "end"} <= {w.split(":")[0] for w in rows if ":" in w}
