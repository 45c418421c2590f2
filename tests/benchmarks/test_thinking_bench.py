"""Smoke test: `python -m benchmarks thinking` runs end to end at tiny sizes and writes its JSON; the incremental
render does the same work per turn at both sizes, and the hybrid rows show each system's prefill."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import thinking


def _rows(path: Path) -> list[dict[str, Any]]:
    doc: dict[str, Any] = json.loads(path.read_text())
    assert {"benchmark", "date", "machine", "params", "rows"} <= doc.keys()
    rows: list[dict[str, Any]] = doc["rows"]
    return rows


def test_thinking_writes_render_and_hybrid_rows(tmp_path: Path, smollm2_path: Path) -> None:
    argv = ["--sizes", "10,40", "--reps", "1", "--starts-upto", "10", "--turns", "3", "--llama-server", ""]
    thinking.main([*argv, "--model", str(smollm2_path), "--out", str(tmp_path)])
    render = _rows(tmp_path / "thinking-render.json")
    assert [(r["messages"], r["path"]) for r in render] == [
        (10, "incremental (per-session cache)"),
        (10, "full render, no starts"),
        (10, "full render + starts"),
        (40, "incremental (per-session cache)"),
        (40, "full render, no starts"),
    ]
    inc = [r for r in render if r["path"].startswith("incremental")]
    assert inc[0]["renders"] == inc[1]["renders"] > 0  # flat: the same renders at 10 and 40 messages
    full = [r for r in render if r["path"] == "full render, no starts"]
    assert full[1]["chars_tokenized"] > 3 * full[0]["chars_tokenized"]  # a full render grows with the history
    assert inc[1]["chars_tokenized"] < 1.1 * inc[0]["chars_tokenized"]  # the incremental one does not
    hybrid = _rows(tmp_path / "thinking-hybrid.json")
    assert [r["turn"] for r in hybrid] == [1, 2, 3, "all"]
    first, *later = hybrid[:-1]
    assert first["turnstile"] == first["new"] == first["prompt"]
    for r in later:  # the previous answer and the new message; llama-server's rules: 4 more
        assert (r["turnstile"], r["turnstile_llama_server_rules"]) == (r["new"], r["new"] + 4)
        assert r["llama_server"] == ""
    assert hybrid[-1]["turnstile"] == sum(r["turnstile"] for r in hybrid[:-1])
