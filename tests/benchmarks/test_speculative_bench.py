"""Smoke test: `python -m benchmarks speculative` runs end to end on the tiny model and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import speculative


def test_speculative_benchmark_writes_its_table(tiny_llama: Path, tmp_path: Path) -> None:
    args = ["--model", str(tiny_llama), "--reps", "1", "--copy-runs", "1", "--agent-turns", "1", "--chat-turns", "1"]
    args += ["--quotes-turns", "1"]
    speculative.main([*args, "--threads", "1", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "speculative.json").read_text())
    assert doc["benchmark"] == "speculative"
    rows = {(r["workload"], r["system"]): r for r in doc["rows"]}
    pairs = {(wl, s) for wl in ("copy", "agent", "quotes", "chat") for s in ("turnstile", "turnstile ngram")}
    assert set(rows) == pairs | {("copy", "engine loop")}
    for (_, system), r in rows.items():
        assert set(speculative.COLUMNS) <= r.keys()
        assert r["generated"] > 0
        assert r["accepted"] <= r["draft_n"]
        if system == "engine loop":
            assert r["draft_n"] == 0
        if system == "turnstile":
            assert r["draft_n"] == 0 and r["vs_off"] == 1.0
    assert set(doc["params"]["index_rebuild_ms"]) == {"1024", "4096", "16384"}
