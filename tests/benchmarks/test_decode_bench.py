"""The decode-speed tools: the drafter replay counts exactly, and `python -m benchmarks decode` runs end to end
on the default model (turnstile and the engine loop, tiny sizes) with equal greedy texts."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import decode
from benchmarks.draft_replay import Stream, replay


def test_replay_counts_a_copy_and_a_divergence_exactly() -> None:
    passage = list(range(100, 140))
    prompt = [1, 2, *passage, 3]
    # the reply copies the first 30 tokens of the passage, then says something else
    generated = [*passage[:30], 7, 8, 9, 0]
    r = replay([Stream(prompt, generated)], lambda t: t == 0)
    assert r.tokens == len(generated) - 1
    assert r.accepted + r.steps == r.tokens  # every token after the first is a step's or an accepted draft's
    # the 4-gram key first matches at the 4th token (a 4-token match: a draft of 2, accepted), then a longer match
    # drafts the limit, 16 (accepted), then 32 (the limit doubled), of which 6 are accepted before the reply
    # leaves the passage; 7, 8, 9 and the end match nothing: 9 steps in all
    assert (r.steps, r.drafted, r.accepted) == (9, 2 + 16 + 32, 2 + 16 + 6)


def test_decode_benchmark_runs_and_texts_agree(tmp_path: Path) -> None:
    tiny = ["--reps", "1", "--runs", "1", "--max-tokens", "6", "--threads", "1"]
    decode.main([*tiny, "--systems", "turnstile,engine", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "decode.json").read_text())
    rows = {r["system"]: r for r in doc["rows"]}
    assert set(rows) == {"turnstile", "engine loop"}
    for r in rows.values():
        assert r["steps"] == 5  # 6 tokens: the first from the prompt's logits, then 5 one-token steps
        assert r["same_text"] == "1/1"
        assert r["llama_decode_ms"] > 0 and r["ms_step"] >= r["llama_decode_ms"]
