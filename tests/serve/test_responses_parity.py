"""Parity oracle for the Responses API: the interleaved 6 x 5 workload, each turn resent as its whole
history to stateless `/v1/responses`, gets the same texts (greedy) from `turnstile serve` as from
llama-server `-np 1`; and one tool turn, resent whole the same way, gets the same shape: a `function_call`
item (name, parsed arguments, status), then, with its `function_call_output`, the same answer text.

The tool turn runs on `write_tool_caller`'s tiny Qwen 2.5-template model (SmolLM2's template has no tools,
and a random-weight model never reaches a call inside llama-server's grammar, which admits free text before
it): its greedy replies are a fixed call and, once a tool result is in the prompt, a fixed answer, so both
servers must render, constrain and parse the same way to agree.

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (the oracle gate in tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.support import workloads
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.process import ServeProcess

_BINARY = llama_server_binary()

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

N_CONV, N_TURN, N_CTX, THREADS, MAX_TOKENS = 6, 5, 4096, 2, 48

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ANSWER = "It is sunny in Paris."
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


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


def tool_turn(oai: OpenAI, extra: dict[str, Any]) -> dict[str, Any]:
    """A tool call under `tool_choice: required`, then its output sent back with the whole history: the
    shape of both replies (ids left out, they differ by design)."""
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = oai.responses.create(
        model="m",
        input=history,
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body=extra,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    shape: dict[str, Any] = {
        "first": [(o.type, getattr(o, "status", None)) for o in first.output],
        "calls": [(c.name, json.loads(c.arguments)) for c in calls],
        "first_status": first.status,
        "first_usage": (first.usage.input_tokens, first.usage.output_tokens) if first.usage else None,
    }
    history += [
        {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls
    ]
    history += [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 21 C"} for c in calls]
    second = oai.responses.create(
        model="m",
        input=history,
        tools=[WEATHER],
        max_output_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body=extra,
    )
    shape |= {
        "second": [o.type for o in second.output],
        "text": second.output_text,
        "second_status": second.status,
        "second_usage": (second.usage.input_tokens, second.usage.output_tokens) if second.usage else None,
    }
    return shape


def test_tool_turn_matches_llama_server(caller: Path) -> None:
    with LlamaServer(_BINARY, caller, n_ctx=2048, threads=THREADS, cache_ram_mib=256) as srv:
        want = tool_turn(OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0), {})
    argv = ["--model", str(caller), "--ctx", "2048", "--threads", str(THREADS), "--cache-rules", "llama-server"]
    with ServeProcess(*argv) as ts:
        got = tool_turn(OpenAI(base_url=ts.url + "/v1", api_key="none", max_retries=0), {"store": False})
    assert want["calls"] == [("get_weather", {"city": "Paris"})]  # the model's fixed call, as llama-server parsed it
    assert want["text"] == ANSWER
    assert got == want
