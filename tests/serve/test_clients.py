"""Real coding agents against a real `turnstile serve`: Codex CLI (Responses), Claude Code (Messages) and
OpenCode (chat completions), installed from npm at test time into the ignored cache `.cache/npm-clients`
(pinned versions; nothing third-party is committed), pointed at the server through a recording proxy
(`tests.support.recorder`, the bodies under the test's tmp dir, then copied to `.cache/recorded/CLIENT/`
for `python -m benchmarks agents`).

The model is a scripted Qwen 2.5 tool caller: its greedy reply is one call of the client's own file or shell
tool (Codex's `exec_command`, Claude Code's `Write`, OpenCode's `write`), then an answer once the tool result
is in the prompt. So each client runs a real tool that writes the file the task asks for and sends the
result back: exit 0, the file written, the round trip in the recorded traffic. Codex runs on the byte-level
model (`scripted_models`); Claude Code and OpenCode, whose first prompts are 50-80 kB, on the one with
SmolLM2's BPE tokenizer (`scripted_bpe`), so a prompt is ~4 bytes a token.

Offline: each client runs with its non-essential traffic switched off (telemetry, update checks, model
lists) and a home of its own under the tmp dir; OpenCode's startup install of `@opencode-ai/plugin` is
served from a copy installed beside the client. Nothing but `npm install` reaches the network.

Without npm (or the registry) the tests skip, except with CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import ServeProcess
from tests.support.recorder import Recorder
from tests.support.scripted_bpe import write_bpe_tool_caller
from tests.support.scripted_models import write_tool_caller

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / ".cache" / "npm-clients"
RECORDED = ROOT / ".cache" / "recorded"
CODEX = "@openai/codex@0.171.0"
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.332"
OPENCODE = "opencode-ai@1.18.33"
OPENCODE_PLUGIN = "@opencode-ai/plugin@1.18.33"
CTX = 65536  # Codex's first prompt is ~36,000 tokens in the scripted model's byte-level vocabulary
BPE_CTX = 32768  # Claude Code's and OpenCode's first prompts in SmolLM2's tokens: under 20,000
TEXT = "hello from codex"


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _npm_install(prefix: Path, spec: str, done: Path) -> None:
    """`npm install SPEC` into `prefix` unless `done` exists (a pinned version, once per cache)."""
    if done.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        _unavailable("npm is not installed")
    prefix.mkdir(parents=True, exist_ok=True)
    argv = [str(npm), "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", spec]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if result.returncode != 0 or not done.exists():
        _unavailable(f"npm install {spec} failed: {result.stderr[-1000:]}")


@pytest.fixture(scope="session")
def codex() -> Path:
    """The Codex binary, installed with npm on first use (about 30 s, 424 MB in the ignored cache)."""
    binary = CLIENTS / "node_modules" / ".bin" / "codex"
    _npm_install(CLIENTS, CODEX, binary)
    return binary


@pytest.fixture(scope="session")
def claude() -> Path:
    """The Claude Code binary (a native build from the platform package), installed with npm on first use."""
    binary = CLIENTS / "node_modules" / ".bin" / "claude"
    _npm_install(CLIENTS, CLAUDE_CODE, binary)
    return binary


@pytest.fixture(scope="session")
def opencode() -> tuple[Path, Path]:
    """The OpenCode binary, and a config dir holding the `@opencode-ai/plugin` it installs at startup (each
    test copies it into its own config dir, so OpenCode finds it installed and fetches nothing)."""
    binary = CLIENTS / "node_modules" / ".bin" / "opencode"
    _npm_install(CLIENTS, OPENCODE, binary)
    config = CLIENTS / "opencode-config"
    _npm_install(config, OPENCODE_PLUGIN, config / "node_modules" / "@opencode-ai" / "plugin" / "package.json")
    return binary, config


def _keep(client: str, recorded: Path, model: dict[str, Any]) -> None:
    """Copy the recorded bodies to `.cache/recorded/CLIENT/` with the model's `model.json`, for `python -m
    benchmarks agents` (ignored, never committed)."""
    keep = RECORDED / client
    shutil.rmtree(keep, ignore_errors=True)
    shutil.copytree(recorded, keep)
    (keep / "model.json").write_text(json.dumps(model))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)


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
        done = _run(argv, work, env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        bodies = [json.loads(p.read_bytes()) for p in rec.bodies()]
    _keep("codex", tmp_path / "recorded", {"call": json.dumps(call), "answer": "Done.", "n_ctx": CTX})
    assert (work / "notes.txt").read_text() == TEXT
    assert "Done." in done.stdout
    first, last = bodies[0], bodies[-1]
    assert any(t.get("name") == "exec_command" for t in first["tools"])  # the tool the model was scripted to call
    assert first["store"] is False and "client_metadata" in first  # what Codex always sends
    calls = [i for i in last["input"] if i.get("type") == "function_call"]
    outputs = [i for i in last["input"] if i.get("type") == "function_call_output"]
    assert [c["name"] for c in calls] == ["exec_command"] and json.loads(calls[0]["arguments"]) == call["arguments"]
    assert [o["call_id"] for o in outputs] == [calls[0]["call_id"]]  # the tool's result went back to the model


def _bpe_server(tmp_path: Path, call: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The scripted BPE model for `call`, and its `model.json` (`tokenizer`: which scripted model)."""
    text = json.dumps(call)
    model = write_bpe_tool_caller(tmp_path / "caller.gguf", call=text, answer="Done.", n_ctx=BPE_CTX)
    return model, {"call": text, "answer": "Done.", "n_ctx": BPE_CTX, "tokenizer": "smollm2"}


def test_claude_code_writes_the_file_through_a_tool_round_trip(claude: Path, tmp_path: Path) -> None:
    home, work = tmp_path / "claude-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    text = "hello from claude"
    call = {"name": "Write", "arguments": {"file_path": str(work / "notes.txt"), "content": text}}  # schema order
    model, meta = _bpe_server(tmp_path, call)
    with (
        ServeProcess("--model", model, "--threads", "1", "--ctx", str(BPE_CTX)) as srv,
        Recorder(srv.url, tmp_path / "recorded") as rec,
    ):
        env = {
            **os.environ,
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "ANTHROPIC_BASE_URL": rec.url,
            "ANTHROPIC_API_KEY": "unused",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # telemetry, error reports, update checks
            "DISABLE_AUTOUPDATER": "1",
        }
        task = f"Write '{text}' into notes.txt."
        done = _run([str(claude), "-p", task, "--model", "local", "--permission-mode", "acceptEdits"], work, env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + srv.stderr()[-3000:]
        bodies = [json.loads(p.read_bytes()) for p in rec.bodies()]
    _keep("claude-code", tmp_path / "recorded", meta)
    assert (work / "notes.txt").read_text() == text
    assert "Done." in done.stdout
    first, last = bodies[0], bodies[-1]
    assert any(t.get("name") == "Write" for t in first["tools"])
    assert any(m["role"] == "system" for m in first["messages"])  # what Claude Code 2.1 sends inside messages
    uses = [b for m in last["messages"] if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    results = [b for m in last["messages"] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"]  # fmt: skip
    assert [(u["name"], u["input"]) for u in uses] == [("Write", call["arguments"])]
    assert [r["tool_use_id"] for r in results] == [uses[0]["id"]]  # the tool's result went back to the model


def test_opencode_writes_the_file_through_a_tool_round_trip(opencode: tuple[Path, Path], tmp_path: Path) -> None:
    binary, plugin = opencode
    home, work = tmp_path / "opencode-home", tmp_path / "work"
    work.mkdir()
    shutil.copytree(plugin, home / ".config" / "opencode")
    text = "hello from opencode"
    # the arguments in the schema's order (content, filePath): the tool grammar enforces it
    call = {"name": "write", "arguments": {"content": text, "filePath": str(work / "notes.txt")}}
    model, meta = _bpe_server(tmp_path, call)
    with (
        ServeProcess("--model", model, "--threads", "1", "--ctx", str(BPE_CTX)) as srv,
        Recorder(srv.url, tmp_path / "recorded") as rec,
    ):
        limit = {"context": BPE_CTX, "output": 4096}
        provider = {"npm": "@ai-sdk/openai-compatible", "name": "turnstile",
                    "options": {"baseURL": f"{rec.url}/v1", "apiKey": "unused"},
                    "models": {"local": {"name": "local", "tool_call": True, "limit": limit}}}  # fmt: skip
        config = {"provider": {"turnstile": provider}, "model": "turnstile/local", "small_model": "turnstile/local",
                  "autoupdate": False, "share": "disabled", "permission": {"edit": "allow"}}  # fmt: skip
        (tmp_path / "opencode.json").write_text(json.dumps(config))
        env = {
            **os.environ,
            "HOME": str(home),
            "PWD": str(work),  # OpenCode takes its project directory from $PWD, not from its working directory
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "OPENCODE_CONFIG": str(tmp_path / "opencode.json"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",  # models.dev
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",  # no ~/.claude prompts or skills
            "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
        }
        done = _run([str(binary), "run", f"Write '{text}' into notes.txt."], work, env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + srv.stderr()[-3000:]
        bodies = [json.loads(p.read_bytes()) for p in rec.bodies()]
    _keep("opencode", tmp_path / "recorded", meta)
    assert (work / "notes.txt").exists(), done.stdout[-2000:] + done.stderr[-2000:]
    assert (work / "notes.txt").read_text() == text
    assert "Done." in done.stdout
    turns = [b for b in bodies if b.get("tools")]  # the agent's turns (the title request offers no tools)
    assert any(t["function"]["name"] == "write" for t in turns[0]["tools"])
    last = turns[-1]["messages"]
    calls = [c for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = [m for m in last if m["role"] == "tool"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("write", call["arguments"])
    ]
    assert [r["tool_call_id"] for r in results] == [calls[0]["id"]]  # the tool's result went back to the model
