"""Smoke test: `python -m benchmarks fairness` runs end to end on a tiny model (turnstile only) and writes JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import fairness


def test_fairness_writes_json(tiny_llama: Path, tmp_path: Path) -> None:
    fairness.main(["--model", str(tiny_llama), "--n-ctx", "1024", "--threads", "1", "--out", str(tmp_path),
                   "--doc-tokens", "300", "--shorts", "2", "--short-tokens", "3", "--long-tokens", "2",
                   "--first", "0", "--gap", "0", "--n-batch", "64", "--quantum", "0",
                   "--systems", "fifo,fair,fair-defer"])  # fmt: skip
    doc = json.loads((tmp_path / "fairness.json").read_text())
    assert [r["system"] for r in doc["rows"]] == ["turnstile fifo", "turnstile fair", "turnstile fair, defer_replies"]
    for r in doc["rows"]:
        assert set(fairness.COLUMNS) <= r.keys() and len(r["short_ttft_ms"]) == 2
        assert r["texts_equal_fifo"] is True
    assert doc["rows"][0]["pauses"] == 0
    assert 250 <= doc["params"]["doc_tokens"] <= 300
