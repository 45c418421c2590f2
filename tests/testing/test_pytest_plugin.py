"""The pytest plugin (`runtime.testing.pytest_plugin`) driven through `pytester` on a sample suite of 20 tests in
4 files (tests/support/pytest_plugin_suite.py) over the tiny llama: one model load per process, sessions of different
tests apart, a cancelled call leaves nothing; a second run served from the disk tier; record, replay without the
model file, a changed prompt failing exactly its test; pytest-xdist workers sharing the cache directory."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from pathlib import Path

import pytest

from tests.support.pytest_plugin_suite import write_suite

# installed (the lead's editable install): pytest loads the entry point itself, and `-p` would register it twice
INSTALLED = any(ep.name == "turnstile" for ep in importlib.metadata.entry_points(group="pytest11"))
LOAD = () if INSTALLED else ("-p", "runtime.testing.pytest_plugin")
PLUGIN = (*LOAD, "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning")
SUMMARY = re.compile(
    r"turnstile: (\d+) turns, (\d+) prompt / (\d+) cached / (\d+) prefilled tokens, [\d.]+ model s, (\d+) model loads, "
    r"cassettes (\d+) hits / (\d+) misses / (\d+) recorded"
)
FIELDS = ("turns", "prompt", "cached", "prefilled", "loads", "hits", "misses", "recorded")
# a second run prefills again the cancelling tests' "Hello?" turns whole: 4 prompts of 24 tokens, each cached only in
# a state that went on to its reply, so they share under turnstile's `min_shared_prefix` (32) with it
AGAIN = 4 * 24


def served_from_disk(first: dict[str, int], second: dict[str, int]) -> bool:
    """Whether the second run prefilled next to nothing beyond the "Hello?" turns (`AGAIN`)."""
    return AGAIN <= second["prefilled"] <= AGAIN + 0.05 * first["prefilled"]


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
    assert served_from_disk(n1, n2), (n1, n2)
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

    # 5. new_episodes: the model answers only the changed test's two turns; only its cassette changes
    fifth = run(pytester, *model, "--turnstile-record-mode", "new_episodes")
    fifth.assert_outcomes(passed=20)
    n5 = summary(fifth.outlines)
    assert (n5["recorded"], n5["hits"]) == (2, 34)
    now = cassettes(root)
    assert [name for name in now if now[name] != recorded[name]] == ["test_anyio_asyncio.json"]
    entries = json.loads(now["test_anyio_asyncio.json"])["entries"]  # 9 kept, 2 new
    assert len(entries) == 11 and sum("1021" in e["prompt"] for e in entries.values()) == 2


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
    assert served_from_disk(first, second), runs


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


MARKED = """
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_default(turnstile):
    assert (await turnstile.chat("a", "Hi", max_tokens=2)).finish_reason == "length"


@pytest.mark.turnstile(n_ctx=512)
async def test_small_context(turnstile):
    assert turnstile.runtime.backend.n_ctx == 512
    assert (await turnstile.chat("a", "Hi", max_tokens=2)).finish_reason == "length"


@pytest.mark.turnstile(record_mode="sometimes")
async def test_bad_mode(turnstile):
    pass
"""


def test_marks_choose_settings_per_test(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makepyfile(test_marked=MARKED)
    result = run(pytester, "--turnstile-model", str(tiny_llama), "--turnstile-no-cache", "--turnstile-threads", "1")
    result.assert_outcomes(passed=2, errors=1)
    assert summary(result.outlines)["loads"] == 2  # another n_ctx: a Runtime of its own
    assert "turnstile record mode must be one of ('none', 'once', 'new_episodes', 'all'), not 'sometimes'" in (
        result.stdout.str()
    )
    assert not (pytester.path / ".pytest_cache").exists() and not (pytester.path / "cassettes").exists()


def test_scripted_fixture_needs_no_model(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_scripted=SCRIPTED)
    result = run(pytester, "--turnstile-model", "missing.gguf")
    result.assert_outcomes(passed=2)
    n = summary(result.outlines)
    assert (n["loads"], n["turns"]) == (0, 0)
    assert not (pytester.path / ".pytest_cache").exists()


PLAIN = """
import sys


def test_light():
    assert "llama_cpp" not in sys.modules
    assert "runtime.api" not in sys.modules


def test_fixture_user(turnstile):
    pass
"""


def _with_entry_point(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Register the plugin as the installed package does (a `pytest11` entry point named `turnstile`), through a
    dist-info on the subprocess's path, so these tests hold with or without the package reinstalled."""
    dist = tmp_path / "site" / "turnstile_plugin_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: turnstile-plugin-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nturnstile = runtime.testing.pytest_plugin\n")
    path = [str(tmp_path / "site"), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))


def test_the_plugin_is_inert_in_a_run_that_does_not_use_it(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_entry_point(monkeypatch, tmp_path)
    pytester.makepyfile(test_plain=PLAIN)
    result = pytester.runpytest_subprocess("-k", "light", "--trace-config")
    result.assert_outcomes(passed=1, deselected=1)
    assert any("turnstile" in line and "pytest_plugin" in line for line in result.outlines)  # it is loaded
    assert not any(line.startswith("turnstile:") for line in result.outlines)  # and says nothing
    assert (pytester.path / ".pytest_cache").is_dir()  # pytest's own cache, without a turnstile directory
    assert not [p for p in pytester.path.rglob("*") if "turnstile" in p.name or p.name == "cassettes"]


def test_no_turnstile_turns_it_off(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_entry_point(monkeypatch, tmp_path)
    pytester.makepyfile(test_plain=PLAIN)
    result = pytester.runpytest_subprocess("-p", "no:turnstile", "-p", "no:cacheprovider", "-k", "fixture_user")
    result.assert_outcomes(errors=1, deselected=1)
    assert "fixture 'turnstile' not found" in result.stdout.str()
    assert "--turnstile-model" not in pytester.runpytest_subprocess("-p", "no:turnstile", "--help").stdout.str()
    assert "--turnstile-model" in pytester.runpytest_subprocess("--help").stdout.str()


def test_the_entry_point_marker_and_xdist_are_declared() -> None:
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '[project.entry-points.pytest11]\nturnstile = "runtime.testing.pytest_plugin"\n' in text
    assert '"pytest-xdist>=3.5",' in text
    assert '"turnstile(record_mode=None, model=None, **runtime_options):' in text


DEFAULT_MODEL = """
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


SYSTEM = "You are a terse assistant. You answer every question with a single plain word and nothing else. " * 3


async def test_one(turnstile, keep):
    await turnstile.create_session("a", system=SYSTEM)
    keep((await turnstile.chat("a", "Name a colour.", max_tokens=2)).text)
    keep((await turnstile.chat("a", "Another one.", max_tokens=2)).text)


async def test_two(turnstile, keep):
    await turnstile.create_session("a", system=SYSTEM)
    keep((await turnstile.chat("a", "Name a fruit.", max_tokens=2)).text)
"""


@pytest.mark.slow
def test_the_default_model_twice_over_the_cache(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """SmolLM2 (the default model, no --turnstile-model): loaded once a run; the second run's prompts come from
    the disk tier in the default cache directory (.pytest_cache/turnstile/<fingerprint>), same replies."""
    write_suite(pytester.path)
    for name in ("test_asyncio_function.py", "test_asyncio_module.py", "test_anyio_asyncio.py", "test_anyio_trio.py"):
        (pytester.path / name).unlink()
    pytester.makepyfile(test_default_model=DEFAULT_MODEL)
    runs = []
    for k in range(2):
        result = run(pytester, "--turnstile-threads", "2", "--replies", str(tmp_path / f"r{k}"))
        result.assert_outcomes(passed=2)
        runs.append(summary(result.outlines))
    assert runs[0]["loads"] == runs[1]["loads"] == 1
    assert runs[1]["prompt"] == runs[0]["prompt"]
    assert runs[1]["prefilled"] <= 0.05 * runs[0]["prefilled"], runs  # one token a turn, for its logits
    assert replies(tmp_path / "r1") == replies(tmp_path / "r0")
    (states,) = (pytester.path / ".pytest_cache" / "turnstile").iterdir()
    assert len(states.name) == 32 and (states / "states").is_dir()
