"""The pytest plugin (`runtime.testing.pytest_plugin`) driven through `pytester` on a sample suite of 20 tests in
4 files (tests/pytest_plugin_suite.py) over the tiny llama: one model load per process, sessions of different
tests apart, a cancelled call leaves nothing; a second run served from the disk tier; record, replay without the
model file, a changed prompt failing exactly its test; pytest-xdist workers sharing the cache directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.pytest_plugin_suite import write_suite

PLUGIN = ("-p", "runtime.testing.pytest_plugin", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")
SUMMARY = re.compile(
    r"turnstile: (\d+) turns, (\d+) prompt / (\d+) cached / (\d+) prefilled tokens, [\d.]+ model s, (\d+) model loads, "
    r"cassettes (\d+) hits / (\d+) misses / (\d+) recorded"
)
FIELDS = ("turns", "prompt", "cached", "prefilled", "loads", "hits", "misses", "recorded")


def run(pytester: pytest.Pytester, *args: str, subprocess: bool = False) -> pytest.RunResult:
    """A pytester run with the plugin, rooted at the pytester directory (node ids do not depend on the args)."""
    full = (*PLUGIN, f"--rootdir={pytester.path}", *args)
    return pytester.runpytest_subprocess(*full) if subprocess else pytester.runpytest(*full)


def summary(lines: list[str]) -> dict[str, int]:
    found = [m for m in map(SUMMARY.search, lines) if m is not None]
    assert len(found) == 1, lines[-20:]
    return dict(zip(FIELDS, map(int, found[0].groups()), strict=True))


def replies(path: Path) -> list[list[str]]:
    return sorted(json.loads(line) for line in path.read_text().splitlines())


def cassettes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "cassettes").glob("*.json"))}


def test_suite_records_caches_and_replays(pytester: pytest.Pytester, tiny_llama: Path, tmp_path: Path) -> None:
    root = pytester.path
    write_suite(root)
    cache = tmp_path / "cache"
    model = ("--turnstile-model", str(tiny_llama), "--turnstile-cache-dir", str(cache), "--turnstile-threads", "1")

    # 1. record: the model runs (loaded once for the 20 tests on 4 kinds of loops), every reply is recorded
    first = run(pytester, *model, "--turnstile-record-mode", "once", "--replies", str(tmp_path / "r1"))
    first.assert_outcomes(passed=20)
    n1 = summary(first.outlines)
    assert n1["loads"] == 1
    assert n1["recorded"] == 36 and n1["hits"] == 0  # 16 tests x 2 turns + 4 x 1 (the cancelled calls: nothing)
    assert n1["prefilled"] > 0
    recorded = cassettes(root)
    assert sorted(recorded) == [f"{name[:-3]}.json" for name in sorted(write_suite(root))]

    # 2. the same suite again, recording anew: prompts come from the disk tier, the replies are the same
    second = run(pytester, *model, "--turnstile-record-mode", "all", "--replies", str(tmp_path / "r2"))
    second.assert_outcomes(passed=20)
    n2 = summary(second.outlines)
    assert n2["loads"] == 1 and n2["recorded"] == 36
    assert n2["prompt"] == n1["prompt"]
    assert n2["prefilled"] <= 0.05 * n1["prefilled"], (n1, n2)
    assert replies(tmp_path / "r2") == replies(tmp_path / "r1")
    assert cassettes(root) == recorded  # stable files: the same bytes when recorded again

    # 3. replay without the model file: no load, every reply from the cassettes
    missing = ("--turnstile-model", str(tmp_path / "missing.gguf"), "--turnstile-cache-dir", str(tmp_path / "c3"))
    third = run(pytester, *missing, "--replies", str(tmp_path / "r3"))
    third.assert_outcomes(passed=20)
    n3 = summary(third.outlines)
    assert (n3["loads"], n3["turns"], n3["hits"], n3["recorded"]) == (0, 0, 36, 0)
    assert replies(tmp_path / "r3") == replies(tmp_path / "r1")
    assert not (tmp_path / "c3").exists()

    # 4. one prompt changed: exactly that test fails, naming itself and its session, showing the difference
    write_suite(root, changed=21)
    fourth = run(pytester, *missing, "-rf")
    fourth.assert_outcomes(passed=19, failed=1)
    failed = [line for line in fourth.outlines if line.startswith("FAILED ")]
    assert len(failed) == 1 and failed[0].startswith("FAILED test_anyio_asyncio.py::test_talk_1 ")
    text = "\n".join(fourth.outlines)
    assert "no recording for test_anyio_asyncio.py::test_talk_1 (session 's')" in text
    assert "first difference at prompt line 2:" in text
    assert "- recorded: 'Question 21: what is 21 plus 21?<|im_end|>'" in text
    assert "+ now:      'Question 1021: what is 1021 plus 1021?<|im_end|>'" in text
    assert cassettes(root) == recorded  # mode none records nothing


def test_xdist_workers_share_the_cache(pytester: pytest.Pytester, tiny_llama: Path, tmp_path: Path) -> None:
    write_suite(pytester.path)
    model = ("--turnstile-model", str(tiny_llama), "--turnstile-cache-dir", str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        result = run(pytester, *model, "--turnstile-threads", "1", "-n", "2", subprocess=True)
        result.assert_outcomes(passed=20)
        runs.append(summary(result.outlines))
    first, second = runs
    assert first["loads"] == second["loads"] == 2  # each worker loads the model once
    assert second["prompt"] == first["prompt"]
    assert second["prefilled"] <= 0.05 * first["prefilled"], runs


SCRIPTED = """
import anyio
import pytest


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_gate_holds_a_turn(turnstile_scripted, anyio_backend):
    backend = turnstile_scripted.backend
    backend.reply = lambda messages: "scripted answer"
    gate = backend.hold("a")
    async with anyio.create_task_group() as tg:
        tg.start_soon(turnstile_scripted.chat, "a", "hi")
        await gate.arrived()
        assert backend.runs == ["a"]
        gate.open()
    session = await turnstile_scripted.get_session("a")
    assert [m.content for m in session.messages] == ["hi", "scripted answer"]
"""


def test_scripted_fixture_needs_no_model(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_scripted=SCRIPTED)
    result = run(pytester, "--turnstile-model", "missing.gguf")
    result.assert_outcomes(passed=2)
    n = summary(result.outlines)
    assert (n["loads"], n["turns"]) == (0, 0)
    assert not (pytester.path / ".pytest_cache").exists()
