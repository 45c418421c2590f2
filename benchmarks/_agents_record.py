"""Record a longer Codex session for `python -m benchmarks agents` (through the machinery of
tests/serve/test_clients.py: the scripted Qwen 2.5 tool caller behind a real `turnstile serve`, a recording
proxy, `codex exec`), then `codex exec resume --last` with one more task a run, so the session has
`1 + 1 + resumes` requests: the tool call, the answer once the tool result is in, and one answer per resume
(the whole input resent each time, `store: false`). Written in tests/serve/test_clients.py's format:
`NNNN-v1-responses.json` bodies and `model.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks._cli import progress
from tests.support.process import ServeProcess
from tests.support.recorder import Recorder
from tests.support.scripted_models import write_tool_caller

__all__ = ["record_codex"]

CTX = 65536  # Codex's first prompt is ~36,000 tokens in the scripted model's byte-level vocabulary
TEXT = "hello from codex"
FOLLOW_UPS = (
    "Now tell me what notes.txt says.",
    "Is the file in the current directory?",
    "How many words does it hold?",
    "Would a shorter greeting fit better?",
    "Summarize what you did in this session.",
)


def record_codex(codex: Path, out: Path, *, resumes: int = len(FOLLOW_UPS), threads: int = 1) -> Path:
    """Run the session and write its recording to `out` (replaced); `out`."""
    call = {"name": "exec_command", "arguments": {"cmd": f"printf '{TEXT}' > notes.txt"}}
    with tempfile.TemporaryDirectory(prefix="record-codex-") as t:
        tmp = Path(t)
        model = write_tool_caller(tmp / "caller.gguf", call=json.dumps(call), answer="Done.", n_ctx=CTX)
        home, work = tmp / "codex-home", tmp / "work"
        home.mkdir()
        work.mkdir()
        with (
            ServeProcess("--model", model, "--threads", str(threads), "--ctx", str(CTX)) as srv,
            Recorder(srv.url, tmp / "recorded") as rec,
        ):
            (home / "config.toml").write_text(
                'model = "local"\nmodel_provider = "turnstile"\n[model_providers.turnstile]\nname = "turnstile"\n'
                f'base_url = "{rec.url}/v1"\nwire_api = "responses"\nenv_key = "TURNSTILE_KEY"\n'
            )
            env = {**os.environ, "CODEX_HOME": str(home), "TURNSTILE_KEY": "unused"}
            flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
            runs = [[str(codex), "exec", *flags, "Write 'hello from codex' into notes.txt."]]
            runs += [[str(codex), "exec", "resume", "--last", *flags, task] for task in FOLLOW_UPS[:resumes]]
            for i, argv in enumerate(runs):
                done = subprocess.run(
                    argv, cwd=work, env=env, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL
                )
                if done.returncode != 0:
                    raise RuntimeError(f"codex run {i} exited {done.returncode}: {done.stderr[-2000:]}")
                progress(f"codex run {i + 1}/{len(runs)}: {len(rec.bodies())} requests recorded")
        if (work / "notes.txt").read_text() != TEXT:
            raise RuntimeError("codex did not write notes.txt")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tmp / "recorded", out)
    (out / "model.json").write_text(json.dumps({"call": json.dumps(call), "answer": "Done.", "n_ctx": CTX}))
    return out
