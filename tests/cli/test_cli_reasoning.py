"""`turnstile serve`'s reasoning flags (llama-server's `--reasoning`, `--reasoning-format`, `--reasoning-budget`,
`--reasoning-budget-message`): bad values are one clean usage line (exit 2, before any model is loaded), good ones
reach `Runtime.open`: a served reply (a real `turnstile serve` process, the official openai client) equals the reply
of a Runtime opened with the keywords the flags stand for, on a tiny model whose template (DeepSeek R1 distill)
opens the reasoning block in its generation prompt, so the budget and "off" decide what the reply holds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from runtime import Runtime
from tests.support.process import ServeProcess
from tests.support.reasoning_models import vendored_template, write_thinking

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "hi"}]


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "runtime.cli", "serve", "--model", "/nonexistent.gguf", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reasoning", "maybe"], "argument --reasoning: invalid choice: 'maybe'"),
        (["--reasoning-format", "deepseek-legacy"], "argument --reasoning-format: invalid choice"),
        (["--reasoning-budget", "-2"], "--reasoning-budget must be -1 (no limit), 0 or a number of tokens"),
        (["--reasoning-budget", "ten"], "argument --reasoning-budget: invalid int value: 'ten'"),
        (["--reasoning-budget", str(1 << 25)], "--reasoning-budget must be -1"),
    ],
)
def test_bad_reasoning_flags_are_one_usage_line(args: list[str], message: str) -> None:
    r = serve(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.rstrip().splitlines()[-1]
    assert message in last and re.match(r"turnstile( serve)?: error: ", last), r.stderr


# (flags, Runtime.open keywords they stand for, what the reply holds: (content starts with, reasoning))
CASES: list[tuple[list[str], dict[str, Any], tuple[str, str | None]]] = [
    (
        ["--reasoning-budget", "0", "--reasoning-budget-message", "done"],
        {"reasoning_budget": 0, "reasoning_budget_message": "done"},
        ("", "\ndone"),  # the block the generation prompt opened holds its newline and the message, then closes
    ),
    (
        ["--reasoning-budget", "0", "--reasoning-format", "none"],
        {"reasoning_budget": 0, "reasoning_format": "none"},
        ("<think>\n</think>", None),  # "none": the reasoning stays in the content, tags and all
    ),
    (["--reasoning", "off", "--reasoning-format", "deepseek"], {"reasoning": "off"}, ("", "")),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("flags", "keywords", "holds"), CASES)
async def test_reasoning_flags_reach_the_runtime(
    tmp_path: Path, flags: list[str], keywords: dict[str, Any], holds: tuple[str, str | None]
) -> None:
    model = write_thinking(tmp_path / "r1.gguf", vendored_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"))
    with ServeProcess("--model", model, "--threads", "1", "--ctx", "1024", *flags) as srv:
        oai = AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = await oai.chat.completions.create(model="m", messages=HI, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        await oai.close()
    served = (r.choices[0].message.content or "", (r.choices[0].message.model_extra or {}).get("reasoning_content"))
    async with Runtime.open(model, n_ctx=1024, n_threads=1, **keywords) as rt:
        reply = await rt.complete(HI, max_tokens=8, temperature=0)
    assert served[0] == reply.text
    assert (served[1] or "") == reply.reasoning
    start, reasoning = holds
    assert served[0].startswith(start)
    if reasoning is None:
        assert not served[1] and "</think>" in served[0]
    else:
        assert (served[1] or "") == reasoning and "think>" not in served[0]
