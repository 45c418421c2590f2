"""Smoke test: `long-conversation` runs end to end at tiny sizes (on the tiny llama) and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import long_conversation


def test_long_conversation_writes_both_tables(tmp_path: Path, tiny_llama: Path) -> None:
    args = ["--turns", "3", "--keeps", "0.25", "--naive-turns", "2", "--threads", "1", "--sizes", "4,8", "--reps", "2"]
    long_conversation.main(["--model", str(tiny_llama), *args, "--out", str(tmp_path)])
    window = json.loads((tmp_path / "long-conversation.json").read_text())
    assert [(r["policy"], r["keep"], r["turns"]) for r in window["rows"]] == [
        ("window", 0.25, 3),
        ("naive (drop one turn)", 1.0, 2),
    ]
    for r in window["rows"]:
        assert set(long_conversation.WINDOW_COLUMNS) <= r.keys()
        assert r["cuts"] == 0 and r["ratio"] > 0  # 3 turns fit 2048 tokens: nothing to cut yet
    render = json.loads((tmp_path / "long-conversation-render.json").read_text())
    assert sorted({r["messages"] for r in render["rows"]}) == [4, 8]
    assert {r["path"] for r in render["rows"]} == {
        "incremental (per-session cache)",
        "full render, no starts",
        "full render + starts",
    }
