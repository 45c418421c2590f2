"""Token probabilities and llama-server's stream extras over HTTP on SmolLM2, in process (httpx's ASGI
transport): Responses' `logprobs` (asked by `include` or `top_logprobs`, whole and in the streamed deltas), chat's
`top_logprobs: 0` (the tokens with no alternatives, as OpenAI), and a chat stream's `return_progress` and
`timings_per_token` chunks. The values themselves are compared with llama-server's in
tests/serve/test_llama_probs_oracle.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.serve.http import app as make_app

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def served(model: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with Runtime.open(model, n_ctx=512, n_threads=1) as rt:
        transport = httpx.ASGITransport(app=make_app(rt, model_name="smol"))
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=300) as c:
            yield c


def events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]


async def test_responses_logprobs(smollm2_path: Path) -> None:
    async with served(smollm2_path) as client:
        await responses_logprobs(client)


async def responses_logprobs(client: httpx.AsyncClient) -> None:
    ask = {"input": "Name a colour.", "max_output_tokens": 4, "temperature": 0}
    whole = (await client.post("/v1/responses", json=ask | {"top_logprobs": 2})).json()
    part = whole["output"][-1]["content"][0]
    assert "".join(p["token"] for p in part["logprobs"]) == part["text"]
    assert all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in part["logprobs"])
    asked = (await client.post("/v1/responses", json=ask | {"include": ["message.output_text.logprobs"]})).json()
    assert [p["top_logprobs"] for p in asked["output"][-1]["content"][0]["logprobs"]] == [[]] * len(part["logprobs"])
    plain = (await client.post("/v1/responses", json=ask)).json()
    assert plain["output"][-1]["content"][0]["logprobs"] == []
    r = await client.post("/v1/responses", json=ask | {"top_logprobs": 1, "stream": True})
    deltas = [e for e in events(r.text) if e["type"] == "response.output_text.delta"]
    said = [p["id"] for p in part["logprobs"] if p["token"]]  # a token that adds no text streams no delta
    assert [p["id"] for d in deltas for p in d["logprobs"]] == said


async def test_chat_top_logprobs_zero_and_a_streams_progress_and_timings(smollm2_path: Path) -> None:
    async with served(smollm2_path) as client:
        await chat_top_logprobs_zero(client)
        await chat_stream_progress_and_timings(client)


async def chat_top_logprobs_zero(client: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    r = (await client.post("/v1/chat/completions", json=body | {"logprobs": True, "top_logprobs": 0})).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert content and all(c["top_logprobs"] == [] for c in content)
    assert (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["logprobs"] is None


async def chat_stream_progress_and_timings(client: httpx.AsyncClient) -> None:
    body = {
        "messages": [{"role": "user", "content": "This is a test. " * 8}],
        "max_tokens": 3,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_progress": True,
        "timings_per_token": True,
    }
    chunks = events((await client.post("/v1/chat/completions", json=body)).text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None} and "timings" not in chunks[0]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert len(progress) >= 2 and progress[0]["processed"] == progress[0]["cache"]
    assert progress[-1]["processed"] == progress[-1]["total"]
    assert [p["processed"] for p in progress] == sorted({p["processed"] for p in progress})
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert text_chunks and all(c["timings"]["predicted_n"] >= 1 for c in text_chunks)
    assert "timings" in chunks[-1] and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
