"""Run files of llama.cpp's server test suite (`tools/server/tests/unit`) against one system.

The suite is copied from the vendored llama.cpp tree (`tests.support.vendor`, fetched as the oracle
build fetches it) into a temporary directory, so its `tmp/` and caches never touch the tree, and runs
there in its own pytest subprocess with its own cwd. `LLAMA_SERVER_BIN_PATH` points at a two-line script
that execs the shim (`shim.py`) for the system; `PORT` is a free port; the plugin (`plugin.py`) records
each test's outcome. Nothing of the suite is kept in this repository.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CI_FILES", "FILES", "Outcome", "SuiteRun", "run_suite", "suite_dir"]

REPO = Path(__file__).resolve().parents[2]

# the files the differential runs by default: every file of the suite with a model the table substitutes
FILES: tuple[str, ...] = (
    "test_basic",
    "test_chat_completion",
    "test_completion",
    "test_compat_anthropic",
    "test_compat_oai_responses",
    "test_ctx_shift",
    "test_embedding",
    "test_ignore_eos",
    "test_infill",
    "test_metrics",
    "test_rerank",
    "test_security",
    "test_slot_save",
    "test_stream",
    "test_template",
    "test_tokenize",
    "test_tool_call",
)


# what CI runs against turnstile alone (tests/benchmarks/test_llama_server_suite.py): the files whose expected pass set
# is recorded in tests/data/llama_server_suite_expected.txt. The chat, completion, Anthropic, Responses,
# tool-call and security files join once their set is recorded (--write-expected; see the test's docstring).
CI_FILES: tuple[str, ...] = ("test_template", "test_tokenize")


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed | failed | error | skipped
    reason: str


@dataclass(frozen=True)
class SuiteRun:
    system: str
    outcomes: dict[str, Outcome]  # node id -> outcome
    seconds: float
    returncode: int
    log: Path


def suite_dir() -> Path:
    """The suite's `tools/server/tests` in the vendored llama.cpp tree (fetched into the cache if needed)."""
    from tests.support.vendor import vendored_tree

    return vendored_tree() / "tools" / "server" / "tests"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _shim_script(directory: Path, system: str) -> Path:
    path = directory / f"{system}-shim"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m benchmarks.llama_server_suite.shim {system} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def run_suite(
    system: str,
    files: list[str],
    work: Path,
    *,
    select: str | None = None,
    timeout: float = 3600.0,
) -> SuiteRun:
    """Run `files` (names like "test_tokenize") of the suite with `system` ("llama-server" or "turnstile")."""
    # the suite names templates as ../../../models/templates/X.jinja from its cwd: keep that layout
    copy = work / system / "tools" / "server" / "tests"
    shutil.copytree(suite_dir(), copy, ignore=shutil.ignore_patterns("tmp", "__pycache__", ".pytest_cache"))
    models = work / system / "models"
    if not models.exists():
        models.symlink_to(suite_dir().parents[2] / "models", target_is_directory=True)
    (copy / "tmp").mkdir(exist_ok=True)
    results = work / system / "results.json"
    log = work / system / "pytest.log"
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(_shim_script(work / system, system)),
        "PORT": str(_free_port()),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(copy), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "TURNSTILE_SUITE_RESULTS": str(results),
        "LLAMA_CACHE": str(copy / "tmp"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("SLOW_TESTS", None)
    env.pop("DEBUG_EXTERNAL", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.llama_server_suite.plugin", "-p", "no:cacheprovider"]
    cmd += ["-o", "addopts=", *(f"unit/{f.removesuffix('.py')}.py" for f in files)]
    if select:
        cmd += ["-k", select]
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(
            cmd, cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    seconds = time.perf_counter() - started
    raw = json.loads(results.read_text()) if results.is_file() else {}
    outcomes = {k: Outcome(v["outcome"], v["reason"]) for k, v in raw.items()}
    return SuiteRun(system, outcomes, seconds, proc.returncode, log)
