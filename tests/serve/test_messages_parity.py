"""Parity oracle for the Anthropic Messages API: the interleaved 6 x 5 workload, sent to /v1/messages with the
official `anthropic` client as stateless requests that resend each conversation's whole history, gets the
same texts, stop reasons and token counts (prompt, cache reads, output) from `turnstile serve --cache-rules
llama-server` as from llama-server's own /v1/messages (`-np 1`), turn by turn, greedy; and one tool turn,
resent whole the same way, gets the same shape: a `tool_use` block (name, input) with stop reason `tool_use`,
then, with its `tool_result`, the same answer text, stop reason and token counts.

The tool turn runs on `write_tool_caller`'s tiny Qwen 2.5-template model (SmolLM2's template has no tools,
and a random-weight model never reaches a call inside llama-server's grammar, which admits free text before
it): its greedy replies are a fixed call and, once a tool result is in the prompt, a fixed answer.

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (see tests/slot/test_parity_oracle.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from anthropic import Anthropic

from tests.support import workloads
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.process import ServeProcess

_BINARY = llama_server_binary()

pytestmark = [pytest.mark.oracle, pytest.mark.slow]  # the oracle gate is in tests/conftest.py

N_CONV, N_TURN = 6, 5
N_CTX, N_BATCH, N_UBATCH, THREADS, CACHE_RAM_MIB = 4096, 2048, 512, 2, 8192
MAX_TOKENS = 48

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ANSWER = "It is sunny in Paris."
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@dataclass(frozen=True)
class Turn:
    label: str
    text: str
    stop_reason: str
    input_tokens: int
    cache_read: int
    output_tokens: int


def play(url: str) -> list[Turn]:
    """The workload through one server's /v1/messages."""
    client = Anthropic(base_url=url, api_key="none", max_retries=0)
    out: list[Turn] = []
    replies: dict[tuple[int, int], str] = {}
    for c, t in workloads.schedule(N_CONV, N_TURN):
        msgs = workloads.messages(c, t, replies)
        system, rest = msgs[0]["content"], msgs[1:]
        m = client.messages.create(
            model="m",
            max_tokens=MAX_TOKENS,
            system=system,
            messages=rest,  # type: ignore[arg-type]
            extra_body={"temperature": 0.0},
        )
        text = "".join(b.text for b in m.content if b.type == "text")
        replies[c, t] = text
        u: Any = m.usage
        label = f"{chr(ord('A') + c)}{t + 1}"
        out.append(
            Turn(label, text, str(m.stop_reason), u.input_tokens, u.cache_read_input_tokens or 0, u.output_tokens)
        )
    return out


def test_interleaved_workload_over_messages_matches_llama_server(smollm2_path: Path) -> None:
    with LlamaServer(
        _BINARY,
        smollm2_path,
        n_ctx=N_CTX,
        threads=THREADS,
        cache_ram_mib=CACHE_RAM_MIB,
        n_batch=N_BATCH,
        n_ubatch=N_UBATCH,
    ) as oracle:
        want = play(oracle.url)
    args = ["--model", smollm2_path, "--ctx", N_CTX, "--threads", THREADS, "--batch", N_BATCH, "--ubatch", N_UBATCH]
    with ServeProcess(*map(str, args), "--cache-ram", str(CACHE_RAM_MIB), "--cache-rules", "llama-server") as srv:
        got = play(srv.url)
    assert srv.returncode == 0
    rows = [f"{'turn':<5}{'stop':>22}{'input':>11}{'cached':>11}{'output':>9}  text"]
    bad = 0
    for s, t in zip(want, got, strict=True):
        pairs = [(s.input_tokens, t.input_tokens), (s.cache_read, t.cache_read), (s.output_tokens, t.output_tokens)]
        ok = s.text == t.text and s.stop_reason == t.stop_reason and all(a == b for a, b in pairs)
        bad += not ok
        cells = "".join(
            f"{f'{a}/{b}' + ('' if a == b else '*'):>{w}}" for (a, b), w in zip(pairs, (11, 11, 9), strict=True)
        )
        stop = f"{s.stop_reason}/{t.stop_reason}" + ("" if s.stop_reason == t.stop_reason else "*")
        same = "=" if s.text == t.text else "* " + repr(s.text[:30]) + " / " + repr(t.text[:30])
        rows.append(f"{s.label:<5}{stop:>22}{cells}  {same}")
    table = "\n".join(rows)
    print(f"Messages parity: {len(want) - bad}/{len(want)} turns equal (llama-server/turnstile)\n{table}")
    assert sum(t.cache_read for t in got) > 0  # the workload does reuse the cache
    if bad:
        pytest.fail(f"{bad} of {len(want)} turns differ (llama-server/turnstile):\n{table}", pytrace=False)


def tool_turn(url: str) -> dict[str, Any]:
    """A `tool_use` under `tool_choice: any`, then its `tool_result` sent back with the whole history: the
    shape of both replies (ids left out, they differ by design)."""
    client = Anthropic(base_url=url, api_key="none", max_retries=0)
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    common: dict[str, Any] = {"model": "m", "max_tokens": MAX_TOKENS, "tools": [WEATHER]}
    first = client.messages.create(
        messages=history, tool_choice={"type": "any"}, extra_body={"temperature": 0.0}, **common
    )
    uses = [b for b in first.content if b.type == "tool_use"]
    shape: dict[str, Any] = {
        "first": [b.type for b in first.content],
        "uses": [(b.name, b.input) for b in uses],
        "first_stop": first.stop_reason,
        "first_usage": (first.usage.input_tokens, first.usage.output_tokens),
    }
    history.append(
        {"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"}) for b in uses]}
    )
    results = [{"type": "tool_result", "tool_use_id": b.id, "content": "sunny, 21 C"} for b in uses]
    history.append({"role": "user", "content": results})
    second = client.messages.create(messages=history, extra_body={"temperature": 0.0}, **common)
    shape |= {
        "second": [b.type for b in second.content],
        "text": "".join(b.text for b in second.content if b.type == "text"),
        "second_stop": second.stop_reason,
        "second_usage": (second.usage.input_tokens, second.usage.output_tokens),
    }
    return shape


def test_tool_turn_over_messages_matches_llama_server(caller: Path) -> None:
    with LlamaServer(_BINARY, caller, n_ctx=2048, threads=THREADS, cache_ram_mib=256) as oracle:
        want = tool_turn(oracle.url)
    args = ["--model", str(caller), "--ctx", "2048", "--threads", str(THREADS), "--cache-rules", "llama-server"]
    with ServeProcess(*args) as srv:
        got = tool_turn(srv.url)
    assert want["uses"] == [("get_weather", {"city": "Paris"})]  # the model's fixed call, as llama-server parsed it
    assert (want["first_stop"], want["text"], want["second_stop"]) == ("tool_use", ANSWER, "end_turn")
    assert got == want
