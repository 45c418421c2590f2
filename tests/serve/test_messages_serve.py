"""The Anthropic Messages API of a real `turnstile serve` process, driven by the official `anthropic` client:
messages.create and messages.stream (the same message under greedy decoding), stop sequences,
count_tokens exact, a tool round trip on a tiny Qwen-template model (the call forced by tool_choice and an
enum schema), thinking blocks on a tiny model with DeepSeek-R1's template (the budget closes the block),
auth (x-api-key, Bearer, 401 in Anthropic's shape), Anthropic-shaped errors, and examples/anthropic_client.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import pytest
from anthropic import AsyncAnthropic

from tests.support.process import ServeProcess
from tests.support.reasoning_models import vendored_template, write_thinking
from tests.support.tool_models import write_qwen

KEY = "test-key"
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
ASK = [{"role": "user", "content": "Name a colour."}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris"]}},
        "required": ["city"],
    },
}
PARIS = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    d = tmp_path_factory.mktemp("messages-models")
    yield {
        "qwen": write_qwen(d / "qwen.gguf"),
        "r1": write_thinking(d / "r1.gguf", vendored_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")),
    }


def serve(model: Path, *extra: str | Path) -> ServeProcess:
    return ServeProcess("--model", model, "--threads", "1", "--ctx", "1024", *extra, env={"TURNSTILE_API_KEY": KEY})


def client(url: str, **kw: Any) -> AsyncAnthropic:
    kw.setdefault("api_key", KEY)
    return AsyncAnthropic(base_url=url, max_retries=0, **kw)


def shape(message: Any) -> dict[str, Any]:
    """A message without what differs between two equal replies (ids, the cache split of the prompt)."""
    body = message.model_dump()
    u = body.pop("usage")
    for block in body["content"]:
        if block["type"] == "tool_use":
            block.pop("id")
        block.pop("parsed_output", None)
    body.pop("id")
    return {**body, "prompt": u["input_tokens"] + u["cache_read_input_tokens"], "output": u["output_tokens"]}


async def test_create_stream_stop_sequences_and_count_tokens(tiny_llama: Path) -> None:
    with serve(tiny_llama) as srv:
        c = client(srv.url)
        system = "You are terse."
        m = await c.messages.create(model="tiny", max_tokens=12, system=system, messages=ASK, **GREEDY)  # type: ignore[arg-type]
        assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
        assert [b.type for b in m.content] == ["text"] and m.stop_reason == "max_tokens" and m.stop_sequence is None
        text = m.content[0].text  # type: ignore[union-attr]
        assert m.usage.output_tokens == 12 and m.usage.cache_read_input_tokens == 0
        async with c.messages.stream(model="tiny", max_tokens=12, system=system, messages=ASK, **GREEDY) as s:  # type: ignore[arg-type]
            pieces = [t async for t in s.text_stream]
            final = await s.get_final_message()
        assert "".join(pieces) == text and len(pieces) > 1
        assert shape(final) == shape(m)
        assert final.usage.cache_read_input_tokens == m.usage.input_tokens - 1  # the slot held the prompt
        n = await c.messages.count_tokens(model="tiny", system=system, messages=ASK)  # type: ignore[arg-type]
        assert n.input_tokens == m.usage.input_tokens

        stop = text[len(text) // 2 :][:2]
        cut = await c.messages.create(
            model="tiny",
            max_tokens=12,
            system=system,
            messages=ASK,  # type: ignore[arg-type]
            stop_sequences=[stop, "never said"],
            **GREEDY,
        )
        assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
        assert cut.content[0].text == text[: text.find(stop)]  # type: ignore[union-attr]
        async with c.messages.stream(
            model="tiny",
            max_tokens=12,
            system=system,
            messages=ASK,
            stop_sequences=[stop],
            **GREEDY,  # type: ignore[arg-type]
        ) as s:
            streamed = await s.get_final_message()
        assert shape(streamed) == shape(cut)


async def test_auth_and_error_shapes(tiny_llama: Path) -> None:
    with serve(tiny_llama) as srv:
        bearer = client(srv.url, api_key=None, auth_token=KEY)  # Authorization: Bearer
        m = await bearer.messages.create(model="tiny", max_tokens=2, messages=ASK)  # type: ignore[arg-type]
        assert m.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError) as e:
            await client(srv.url, api_key="wrong").messages.create(model="tiny", max_tokens=2, messages=ASK)  # type: ignore[arg-type]
        assert e.value.status_code == 401
        assert e.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "incorrect API key provided"},
        }
        async with httpx.AsyncClient(base_url=srv.url) as h:
            r = await h.post("/v1/messages", json={"max_tokens": 2, "messages": ASK})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            r = await h.post("/v1/messages", json={"messages": ASK}, headers={"x-api-key": KEY})
            assert (r.status_code, r.json()) == (
                400,
                {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}},
            )
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client(srv.url).messages.create(
                model="tiny",
                max_tokens=2,
                messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}],
            )
        assert bad.value.body == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "messages[0].content[0]: a user message cannot hold a 'thinking' block",
            },
        }


async def test_tool_round_trip(models: dict[str, Path]) -> None:
    with serve(models["qwen"]) as srv:
        c = client(srv.url)
        forced: dict[str, Any] = {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}}
        m = await c.messages.create(model="q", max_tokens=200, messages=PARIS, **forced, **GREEDY)  # type: ignore[arg-type]
        assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
        call = m.content[0]
        assert (call.name, call.input) == ("get_weather", {"city": "Paris"})  # type: ignore[union-attr]
        async with c.messages.stream(model="q", max_tokens=200, messages=PARIS, **forced, **GREEDY) as s:  # type: ignore[arg-type]
            final = await s.get_final_message()
        assert shape(final) == shape(m)
        counted = await c.messages.count_tokens(model="q", messages=PARIS, **forced)  # type: ignore[arg-type]
        assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens

        any_tool = await c.messages.create(
            model="q",
            max_tokens=200,
            messages=PARIS,
            tools=[WEATHER],
            tool_choice={"type": "any"},
            **GREEDY,  # type: ignore[arg-type]
        )
        assert [(b.type, b.input) for b in any_tool.content] == [("tool_use", {"city": "Paris"})]  # type: ignore[union-attr]

        history: list[Any] = [
            *PARIS,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},  # type: ignore[union-attr]
        ]
        answer = await c.messages.create(
            model="q", max_tokens=6, messages=history, tools=[WEATHER], tool_choice={"type": "none"}, **GREEDY
        )
        assert answer.stop_reason == "max_tokens" and [b.type for b in answer.content] == ["text"]
        assert answer.usage.cache_read_input_tokens > 0  # the prompt extends the first request's
        before = await c.messages.count_tokens(model="q", messages=history, tools=[WEATHER])
        history[-1]["content"][0]["is_error"] = True
        after = await c.messages.count_tokens(model="q", messages=history, tools=[WEATHER])
        assert after.input_tokens > before.input_tokens  # "Error: " goes to the model
        history[-1]["content"][0]["content"] = [{"type": "text", "text": "sunny, 21 C"}]
        blocks = await c.messages.count_tokens(model="q", messages=history, tools=[WEATHER])
        assert blocks.input_tokens == after.input_tokens


async def test_thinking_blocks(models: dict[str, Path]) -> None:
    with serve(models["r1"]) as srv:
        c = client(srv.url)
        thinking: Any = {"type": "enabled", "budget_tokens": 5}
        m = await c.messages.create(model="r1", max_tokens=30, messages=ASK, thinking=thinking, **GREEDY)  # type: ignore[arg-type]
        assert [b.type for b in m.content] == ["thinking", "text"] and m.stop_reason == "max_tokens"
        thought, answer = m.content[0], m.content[1]
        assert thought.signature == "" and thought.thinking  # type: ignore[union-attr]
        async with c.messages.stream(model="r1", max_tokens=30, messages=ASK, thinking=thinking, **GREEDY) as s:  # type: ignore[arg-type]
            deltas: dict[str, list[str]] = {"thinking_delta": [], "text_delta": [], "signature_delta": []}
            async for event in s:
                if event.type == "content_block_delta":
                    d = event.delta
                    deltas[d.type].append(getattr(d, {"signature_delta": "signature"}.get(d.type, d.type[:-6])))
            final = await s.get_final_message()
        assert shape(final) == shape(m)
        assert "".join(deltas["thinking_delta"]) == thought.thinking  # type: ignore[union-attr]
        assert "".join(deltas["text_delta"]) == answer.text and deltas["signature_delta"] == [""]  # type: ignore[union-attr]

        off = await c.messages.create(
            model="r1",
            max_tokens=8,
            messages=ASK,
            thinking={"type": "disabled"},
            **GREEDY,  # type: ignore[arg-type]
        )
        assert [b.type for b in off.content] == ["text"]
        again = await c.messages.create(  # thinking blocks in the history go to the template
            model="r1",
            max_tokens=4,
            messages=[*ASK, {"role": "assistant", "content": m.content}, {"role": "user", "content": "More."}],  # type: ignore[list-item]
            thinking=thinking,
            **GREEDY,
        )
        assert again.content[0].type == "thinking"


def test_the_example_runs_against_the_server(models: dict[str, Path]) -> None:
    root = Path(__file__).resolve().parents[2]
    with serve(models["qwen"]) as srv:
        cmd = [
            sys.executable,
            str(root / "examples" / "anthropic_client.py"),
            "--base-url",
            srv.url,
            "--max-tokens",
            "64",
        ]
        env = {**os.environ, "TURNSTILE_API_KEY": KEY}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("streamed: ")
    rounds = [line for line in lines if line.startswith("[")]
    assert "] calls: get_weather({" in rounds[0] and len(rounds) >= 2
    cached = [int(n) for n in re.findall(r"(\d+) from the cache\]", "\n".join(rounds))]
    assert cached[1] > cached[0]  # the second round's prompt extends the first's
