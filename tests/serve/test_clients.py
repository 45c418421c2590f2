"""Real coding agents against a real `turnstile serve`: Codex CLI (Responses), installed from npm at test time
into the ignored cache `.cache/npm-clients` (a pinned version; nothing third-party is committed), pointed at
the server through a recording proxy (`tests.support.recorder`, the bodies under the test's tmp dir).

The model is the scripted Qwen 2.5 tool caller: its greedy reply is one call of Codex's own shell tool
(`exec_command` with `cmd`, as Codex 0.171 declares it in its first request), then an answer once the tool
result is in the prompt. So Codex runs a real command that writes the file the task asks for and sends the
result back: exit 0, the file written, the round trip in the recorded traffic.

Without npm (or the registry) the test skips, except with CI=true, where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.process import ServeProcess
from tests.support.recorder import Recorder
from tests.support.scripted_models import write_tool_caller

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / ".cache" / "npm-clients"
RECORDED = ROOT / ".cache" / "recorded"
CODEX = "@openai/codex@0.171.0"
CTX = 65536  # Codex's first prompt is ~36,000 tokens in the scripted model's byte-level vocabulary
TEXT = "hello from codex"


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def codex() -> Path:
    """The Codex binary, installed with npm on first use (about 30 s, 424 MB in the ignored cache)."""
    binary = CLIENTS / "node_modules" / ".bin" / "codex"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        _unavailable("npm is not installed")
    CLIENTS.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(npm), "install", "--prefix", str(CLIENTS), "--no-audit", "--no-fund", "--loglevel=error", CODEX],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0 or not binary.exists():
        _unavailable(f"npm install {CODEX} failed: {done.stderr[-1000:]}")
    return binary


def test_codex_exec_writes_the_file_through_a_tool_round_trip(codex: Path, tmp_path: Path) -> None:
    call = {"name": "exec_command", "arguments": {"cmd": f"printf '{TEXT}' > notes.txt"}}
    model = write_tool_caller(tmp_path / "caller.gguf", call=json.dumps(call), answer="Done.", n_ctx=CTX)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    with (
        ServeProcess("--model", model, "--threads", "1", "--ctx", str(CTX)) as srv,
        Recorder(srv.url, tmp_path / "recorded") as rec,
    ):
        (home / "config.toml").write_text(
            'model = "local"\nmodel_provider = "turnstile"\n[model_providers.turnstile]\nname = "turnstile"\n'
            f'base_url = "{rec.url}/v1"\nwire_api = "responses"\nenv_key = "TURNSTILE_KEY"\n'
        )
        env = {**os.environ, "CODEX_HOME": str(home), "TURNSTILE_KEY": "unused"}
        task = "Write 'hello from codex' into notes.txt."
        argv = [str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", task]
        done = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        bodies = [json.loads(p.read_bytes()) for p in rec.bodies()]
    keep = RECORDED / "codex"  # for `python -m benchmarks agents` (ignored, never committed)
    shutil.rmtree(keep, ignore_errors=True)
    shutil.copytree(tmp_path / "recorded", keep)
    (keep / "model.json").write_text(json.dumps({"call": json.dumps(call), "answer": "Done.", "n_ctx": CTX}))
    assert (work / "notes.txt").read_text() == TEXT
    assert "Done." in done.stdout
    first, last = bodies[0], bodies[-1]
    assert any(t.get("name") == "exec_command" for t in first["tools"])  # the tool the model was scripted to call
    assert first["store"] is False and "client_metadata" in first  # what Codex always sends
    calls = [i for i in last["input"] if i.get("type") == "function_call"]
    outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
    assert [c["name"] for c in calls] == ["exec_command"] and json.loads(calls[0]["arguments"]) == call["arguments"]
    assert [o["call_id"] for o in outputs] == [calls[0]["call_id"]]  # the tool's result went back to the model
