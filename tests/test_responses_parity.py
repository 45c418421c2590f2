"""Parity oracle for the Responses API: the interleaved 6 x 5 workload, each turn resent as its whole
history to stateless `/v1/responses`, gets the same texts (greedy) from `turnstile serve` as from
llama-server `-np 1`. (No tool turn: the llama-server build here answers `tool_choice: "required"` on
/v1/responses with plain text, on SmolLM2 and on the tiny Qwen 2.5 tool model alike, so there is no
function call of its to compare with.)

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (the oracle gate in tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from runtime.testing import workloads
from runtime.testing.llama_server import LlamaServer
from runtime.testing.oracle import llama_server_binary
from runtime.testing.process import ServeProcess

_BINARY = llama_server_binary()

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

N_CONV, N_TURN, N_CTX, THREADS, MAX_TOKENS = 6, 5, 4096, 2, 48


def as_item(message: dict[str, str]) -> dict[str, str]:
    """A chat message as a Responses input item (llama-server wants `type` on assistant messages)."""
    return {"type": "message", **message} if message["role"] == "assistant" else message


def play(oai: OpenAI, extra: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    replies: dict[tuple[int, int], str] = {}
    for c, t in workloads.schedule(N_CONV, N_TURN):
        r = oai.responses.create(
            model="m",
            input=[as_item(m) for m in workloads.messages(c, t, replies)],  # type: ignore[misc]
            max_output_tokens=MAX_TOKENS,
            temperature=0.0,
            extra_body=extra,
        )
        replies[c, t] = r.output_text
        texts.append(r.output_text)
    return texts


def test_stateless_responses_match_llama_server(smollm2_path: Path) -> None:
    with LlamaServer(_BINARY, smollm2_path, n_ctx=N_CTX, threads=THREADS, cache_ram_mib=8192) as srv:
        want = play(OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0), {})
    argv = [
        "--model",
        str(smollm2_path),
        "--ctx",
        str(N_CTX),
        "--threads",
        str(THREADS),
        "--cache-rules",
        "llama-server",
        "--cache-ram",
        "8192",
    ]
    with ServeProcess(*argv) as ts:
        got = play(OpenAI(base_url=ts.url + "/v1", api_key="none", max_retries=0), {"store": False})
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b]
    assert not differ, f"{len(differ)} of {len(want)} texts differ (llama-server / turnstile): {differ[:3]}"
