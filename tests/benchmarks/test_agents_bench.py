"""`python -m benchmarks agents` end to end on a small recording in tests/serve/test_clients.py's format (three
Responses bodies as Codex sends them: the task, the tool round trip resent whole with `store: false`, a
follow-up after the answer) on the scripted tool caller: turnstile prefills only each turn's new tokens,
also on the last turn, run after a restart (the disk tier and the replay records); llama-server (the oracle,
when there is one) misses on the re-rendered call, and the miss is explained as such.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from benchmarks import agents

CALL = '{"name":"read_file","arguments":{"path":"notes.txt"}}'
ANSWER = "The notes say hello."
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def _recording(d: Path) -> None:
    d.mkdir(parents=True)
    tools = [{"type": "function", "name": "read_file", "description": "Read a file.", "parameters": SCHEMA}]
    base = {"model": "local", "tools": tools, "store": False, "temperature": 0, "client_metadata": {"a": "b"}}
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read notes.txt."}]},
    ]
    turns = [list(items)]
    items += [
        {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": '{"path":"notes.txt"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "hello"},
    ]
    turns.append(list(items))
    items += [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ANSWER}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks."}]},
    ]
    turns.append(list(items))
    for i, t in enumerate(turns, 1):
        (d / f"{i:04d}-v1-responses.json").write_text(json.dumps({**base, "input": t}))
    (d / "model.json").write_text(json.dumps({"call": CALL, "answer": ANSWER, "n_ctx": 2048}))


def test_the_agents_benchmark_on_a_recording(tmp_path: Path) -> None:
    _recording(tmp_path / "recorded" / "codex-like")
    argv = ["--recorded", str(tmp_path / "recorded"), "--threads", "1", "--out", str(tmp_path)]
    server = os.environ.get("TURNSTILE_LLAMA_SERVER")
    agents.main([*argv, "--llama-server", server] if server else argv)
    rows = json.loads((tmp_path / "agents.json").read_text())["rows"]
    ours = [r for r in rows if r["system"].startswith("turnstile")]
    assert [(r["system"], r["turn"]) for r in ours] == [
        ("turnstile", 1),
        ("turnstile", 2),
        ("turnstile, restarted", 3),
    ]
    for r in ours[1:]:
        assert r["prefilled"] == r["new"] and not r["miss"]  # only the new tokens, also after the restart
    if server:
        theirs = [r for r in rows if r["system"].startswith("llama-server")]
        assert [r["turn"] for r in theirs] == [1, 2, 3]
        assert theirs[1]["miss"] and theirs[1]["prefilled"] > theirs[1]["new"] + 1
        assert (
            theirs[1]["cause"]
            == "previous reply re-rendered unlike its generated tokens (tool-call JSON re-serialized)"
        )
        assert theirs[1]["role"] == "assistant"
