"""Smoke test: `long-context` and `multi-round` run end to end on a tiny model (no llama-server) and write JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import long_context, multi_round


def test_long_context_and_multi_round_write_json(tiny_llama: Path, tmp_path: Path) -> None:
    common = ["--model", str(tiny_llama), "--n-ctx", "512", "--threads", "1", "--out", str(tmp_path)]
    long_context.main([*common, "--conversations", "3", "--rounds", "2", "--doc-tokens", "40", "--max-tokens", "3",
                       "--cache-ram", "1", "--dir", str(tmp_path)])  # fmt: skip
    doc = json.loads((tmp_path / "long-context.json").read_text())
    assert [r["system"] for r in doc["rows"]] == ["turnstile, RAM 1 MiB", "turnstile, RAM 1 MiB + disk"]
    for r in doc["rows"]:
        assert set(long_context.COLUMNS) - {"same_text"} <= r.keys()
        assert r["turns"] == 6 and len(r["per_turn"]) == 6
        assert 0 < r["prefilled"] <= r["prompt_tokens"]
    assert doc["params"]["command"].startswith("python -m benchmarks long-context --model")

    multi_round.main([*common, "--users", "2", "--rounds", "2", "--answer-tokens", "3", "--system-tokens", "40",
                      "--runs", "2"])  # fmt: skip
    doc = json.loads((tmp_path / "multi-round.json").read_text())
    (row,) = doc["rows"]
    assert row["system"] == "turnstile" and row["runs"] == 2 and row["answers"] == 4
    assert [run["tokens"] for run in row["per_run"]] == [2 * 2 * 3, 2 * 2 * 3]  # end of generation ignored
    assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"]
