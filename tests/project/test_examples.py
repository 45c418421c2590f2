"""Every example runs end to end on the tiny llama (as `python examples/NAME.py --model PATH`) and shows the
cache at work: a returning agent's earlier prompt comes back from the slot or the RAM cache.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, model: Path, *args: str) -> str:
    cmd = [sys.executable, str(EXAMPLES / name), "--model", str(model), "--threads", "1", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # the runtime's info events are not shown
    return r.stdout


IN_PROCESS = ["concurrent_agents.py", "debate.py", "round_table.py", "tool_agents.py", "structured_vote.py"]


def usages(out: str) -> list[tuple[int, int, str, int]]:
    """(prompt, cached, source, prefilled) of every "[N prompt ...]" line."""
    found = re.findall(r"\[(\d+) prompt = (\d+) cached \((\w+)\) \+ (\d+) prefilled\]", out)
    return [(int(p), int(c), s, int(f)) for p, c, s, f in found]


def test_every_example_is_short_and_uses_the_public_api() -> None:
    names = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert set(names) >= {"concurrent_agents.py", "debate.py", "round_table.py", "tool_agents.py", "structured_vote.py"}
    for name in IN_PROCESS:
        text = (EXAMPLES / name).read_text()
        assert len(text.splitlines()) <= 75, name
        imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
        assert [line for line in imports if "runtime" in line] == [
            "from runtime import Reply, Runtime, configure_logging"
        ], name


def test_round_table(tiny_llama: Path) -> None:
    out = run_example("round_table.py", tiny_llama, "--max-tokens", "6", "--rounds", "3")
    assert [line for line in out.splitlines() if line.startswith("-- round")] == [
        "-- round 1 --",
        "-- round 2 --",
        "-- round 3 --",
    ]
    for agent in ("historian", "engineer", "poet"):
        assert sum(line.startswith(f"{agent}: ") for line in out.splitlines()) == 3
    turns = usages(out)
    assert len(turns) == 9
    for prompt, cached, source, prefilled in turns[3:]:
        assert cached + prefilled == prompt and cached > prefilled // 2 and source in ("slot", "ram")


def test_debate(tiny_llama: Path) -> None:
    out = run_example("debate.py", tiny_llama, "--max-tokens", "6", "--motion", "tea beats coffee")
    assert out.startswith("Motion: tea beats coffee")
    speakers = [line.split(":")[0] for line in out.splitlines() if re.match(r"(round \d (for|against)|judge):", line)]
    assert speakers == ["round 1 for", "round 1 against", "round 2 for", "round 2 against", "judge"]
    turns = usages(out)
    assert len(turns) == 5
    for prompt, cached, source, prefilled in turns[2:4]:  # round 2: each debater's own side comes back
        assert cached + prefilled == prompt and cached >= turns[0][0] // 2 and source in ("slot", "ram")


@pytest.mark.parametrize("policy", ["fifo", "affinity"])
def test_concurrent_agents(tiny_llama: Path, policy: str) -> None:
    out = run_example("concurrent_agents.py", tiny_llama, "--agents", "5", "--max-tokens", "6", "--policy", policy)
    rows = re.findall(
        r"wave (\d) (agent-\d+)\s+queued\s+([\d.]+)s .* cache (\w+)\s+prompt\s+(\d+) =\s+(\d+) cached", out
    )
    assert len(rows) == 10
    wave1 = [r for r in rows if r[0] == "1"]
    wave2 = [r for r in rows if r[0] == "2"]
    assert sorted(r[1] for r in wave1) == [f"agent-{i}" for i in range(5)]
    assert max(float(r[2]) for r in wave1) > 0  # all asked at once: all but the first waited in the queue
    for _, _agent, _queued, source, prompt, cached in wave2:
        assert source in ("slot", "ram") and int(cached) > int(prompt) // 2
    assert re.search(r"10 turns: \d+ prompt tokens, \d+ from the cache", out)


@pytest.mark.slow
def test_tool_agents(smollm2_path: Path) -> None:
    out = run_example("tool_agents.py", smollm2_path).splitlines()
    assert "calc: called multiply({'a': 12, 'b': 7}) -> 84.0" in out
    assert any(line.startswith("scribe: called write_note(") for line in out)
    assert out[-1].startswith("notebook: {")


@pytest.mark.slow
def test_structured_vote(smollm2_path: Path) -> None:
    out = run_example("structured_vote.py", smollm2_path).splitlines()
    votes = [line for line in out if re.match(r"^a [a-z ]+: (yes|no) \(", line)]
    assert len(votes) == 5, out
    yes = sum(": yes (" in v for v in votes)
    assert out[-1] == "tally: " + ", ".join(f"{k} {n}" for k, n in (("no", 5 - yes), ("yes", yes)) if n)
