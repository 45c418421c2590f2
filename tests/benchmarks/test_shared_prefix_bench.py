"""Smoke test: `python -m benchmarks shared-prefix` runs end to end at tiny sizes and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import shared_prefix


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    assert {"benchmark", "date", "machine", "params", "rows"} <= doc.keys()
    return doc


def test_shared_prefix_writes_storage_and_assembly_rows(tiny_llama: Path, tmp_path: Path) -> None:
    args = ["--model", str(tiny_llama), "--agents", "3", "--turns", "2", "--prefix", "40", "--turn-tokens", "10"]
    args += ["--forks", "1", "--blocks", "8,16", "--assembly-tokens", "100", "--repeat", "2", "--n-ctx", "512"]
    shared_prefix.main([*args, "--threads", "1", "--parts", "storage,assembly", "--out", str(tmp_path)])
    assert not (tmp_path / "shared-prefix-turns.json").exists()
    rows = _load(tmp_path / "shared-prefix.json")["rows"]
    assert [r["block_cells"] for r in rows] == [8, 16]
    for r in rows:
        assert r["states"] == 3 + 1
        assert r["unique_tokens"] == 40 + 3 * 2 * 10 + 10
        assert r["kv_unique_MB"] <= r["stored_MB"] < r["whole_MB"]
    assert rows[0]["stored_MB"] <= rows[1]["stored_MB"]  # smaller blocks: less of the prefix copied per state
    speed = _load(tmp_path / "shared-prefix-assembly.json")["rows"]
    assert [(r["operation"], r["block_cells"]) for r in speed] == [("memcpy (into mapped memory)", "-")] + [
        (op, b)
        for b in (8, 16)
        for op in ("put, all new", "put, all held", "assemble (get)", "restore (state_set of it)")
    ]
    assert all({"median_ms", "GB_s", "x_memcpy"} <= r.keys() for r in speed)


def test_shared_prefix_turns_part_prefills_the_ideal_under_the_lookup_rule(tiny_llama: Path, tmp_path: Path) -> None:
    args = ["--model", str(tiny_llama), "--agents", "3", "--turns", "3", "--prefix", "60", "--forks", "2"]
    args += ["--parts", "turns", "--rounds", "2", "--n-ctx", "1024", "--threads", "1", "--max-tokens", "6"]
    out = tmp_path / "out"  # not there yet: the benchmark makes it
    shared_prefix.main([*args, "--out", str(out)])
    doc = _load(out / "shared-prefix-turns.json")
    assert json.loads((out / "shared-prefix-turns-partial.json").read_text())["rows"] == doc["rows"]
    runs = doc["rows"]
    assert [(r["system"], r["round"]) for r in runs] == [
        ("turnstile", 1),
        ("turnstile-disk", 1),
        ("turnstile-disk", 2),
        ("turnstile", 2),
    ]
    for r in runs:
        assert r["turns"] == 3 * 3 + 2
        assert r["prefilled"] == r["ideal"] > 0  # each turn only what no earlier state holds
        assert r["ram_loads"] + r["disk_loads"] >= 3 * 2  # every agent's later turns and the forks reload
    assert doc["params"]["ram_states"] == 3 and doc["params"]["ram_limit_mib"] >= 1
    summary = _load(out / "shared-prefix-turns-summary.json")["rows"]
    assert [s["system"] for s in summary] == ["turnstile", "turnstile-disk"]
    assert all(s["wall_min_s"] <= s["wall_median_s"] <= s["wall_max_s"] for s in summary)
