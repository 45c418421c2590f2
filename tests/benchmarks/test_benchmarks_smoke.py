"""Smoke test: `overhead` and `concurrent` run end to end at tiny sizes and write their JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import concurrent, overhead


def _load(path: Path) -> dict[str, Any]:
    assert path.is_file(), path
    doc: dict[str, Any] = json.loads(path.read_text())
    assert {"benchmark", "date", "machine", "params", "rows"} <= doc.keys()
    return doc


def test_overhead_and_concurrent_write_json(tmp_path: Path) -> None:
    overhead.main(["--depths", "1,5", "--requests", "10", "--out", str(tmp_path)])
    doc = _load(tmp_path / "overhead.json")
    assert doc["benchmark"] == "overhead"
    rows = doc["rows"]
    assert {(r["layer"], r["policy"], r["queued"]) for r in rows} == {
        (layer, policy, depth)
        for layer in ("scheduler", "runtime")
        for policy in ("fifo", "affinity")
        for depth in (1, 5)
    }
    for r in rows:
        assert set(overhead.COLUMNS) <= r.keys()
        assert r["us_per_request"] > 0
        assert r["requests"] == r["queued"] * r["rounds"]

    tiny = ["--sessions", "4", "--turns", "2", "--max-tokens", "3", "--threads", "1", "--n-ctx", "512"]
    concurrent.main([*tiny, "--out", str(tmp_path)])
    doc = _load(tmp_path / "concurrent.json")
    assert doc["benchmark"] == "concurrent"
    assert [r["policy"] for r in doc["rows"]] == ["fifo", "affinity"]
    for r in doc["rows"]:
        assert set(concurrent.COLUMNS) <= r.keys()
        assert r["replies"] == 8
        assert r["generated"] == 8 * 3  # end of generation ignored: every reply has max_tokens
        assert 0 < r["ttft_p50_ms"] <= r["done_p99_ms"]
        assert r["replies_s"] > 0 and r["tokens_s"] > 0
        # the ticker is sleeping when the sessions start and finishes that sleep after they end
        assert r["lag_samples"] >= 1
        assert 0 <= r["loop_lag_p99_ms"] <= r["loop_lag_max_ms"]
