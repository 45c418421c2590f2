"""examples/testing_app replays its cassettes: its suite passes with the model file missing (no model load),
every reply from tests/cassettes/test_triage.json, and nothing is written into the example's directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.testing.test_pytest_plugin import LOAD, summary

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "testing_app"


def test_the_example_app_replays_its_cassettes(tmp_path: Path) -> None:
    before = sorted(p.relative_to(APP) for p in APP.rglob("*") if "__pycache__" not in p.parts)
    cmd = [sys.executable, "-m", "pytest", *LOAD, "-p", "no:cacheprovider", "-q", "tests"]
    cmd += ["--turnstile-record-mode", "none", "--turnstile-model", str(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
    r = subprocess.run(cmd, cwd=APP, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\b6 passed\b", r.stdout), r.stdout
    n = summary(r.stdout.splitlines())
    assert (n["loads"], n["turns"], n["misses"], n["recorded"]) == (0, 0, 0, 0)
    assert n["hits"] == 6  # 2 tests x 3 model turns, on asyncio and on trio
    assert sorted(p.relative_to(APP) for p in APP.rglob("*") if "__pycache__" not in p.parts) == before
