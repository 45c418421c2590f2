"""`turnstile serve` as a real uvicorn process on a free loopback port, driven by the official `openai` client:
chat and streaming on a tiny model, sessions that survive a restart (the next turn from the disk tier), 401,
413, 429, a client leaving mid-stream, the SIGTERM drain, and one chat on the default SmolLM2."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import openai
import pytest
from openai import AsyncOpenAI

from runtime import Runtime
from sessions import DiskStore
from tests.support.process import ServeProcess

KEY = "test-key"
HI = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
LONG = {"max_tokens": 900, "temperature": 0, "extra_body": {"ignore_eos": True}}  # ~0.5 s on the tiny model


def tiny_args(model: Path, *extra: str | Path) -> list[str | Path]:
    return ["--model", model, "--threads", "1", "--ctx", "1024", *extra]


def client(url: str, key: str = KEY, **kw: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, **kw)


async def metrics(url: str) -> dict[str, float]:
    """The server's /metrics samples by name (with labels)."""
    async with httpx.AsyncClient() as c:
        text = (await c.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("turnstile_")
    }


async def until_queued(url: str, n: int) -> None:
    """Wait (by asking /metrics, no sleeps) until n requests wait in the server's queue."""
    with anyio.fail_after(30):
        while (await metrics(url))["turnstile_queue_depth"] < n:
            pass


async def first_chunk(stream: Any) -> tuple[AsyncIterator[Any], str]:
    it = stream.__aiter__()
    chunk = await it.__anext__()
    return it, chunk.choices[0].delta.content or ""


async def test_chat_stream_and_models(tiny_llama: Path) -> None:
    with ServeProcess(*tiny_args(tiny_llama), env={"TURNSTILE_API_KEY": KEY}) as srv:
        oai = client(srv.url)
        r = await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        u = r.usage
        assert u is not None and u.prompt_tokens_details is not None
        assert r.choices[0].finish_reason in ("stop", "length") and 1 <= u.completion_tokens <= 8
        assert u.prompt_tokens_details.cached_tokens == 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
        timings = (r.model_extra or {})["timings"]
        assert (timings["cache_n"], timings["prompt_n"], timings["predicted_n"]) == (
            0,
            u.prompt_tokens,
            u.completion_tokens,
        )

        stream = await oai.chat.completions.create(
            model="tiny",
            messages=HI,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
        text, usage, finish = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert text == r.choices[0].message.content and finish == r.choices[0].finish_reason
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == u.prompt_tokens - 1  # the same prompt: from the slot
        assert usage.completion_tokens == u.completion_tokens

        assert [m.id async for m in oai.models.list()] == [tiny_llama.name]
        with pytest.raises(openai.AuthenticationError):
            await client(srv.url, "wrong").chat.completions.create(model="t", messages=HI)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as bad:
            await oai.chat.completions.create(model="t", messages=HI, n=2)  # type: ignore[arg-type]
        assert bad.value.status_code == 400
    assert srv.returncode == 0


async def test_body_limit_is_413(tiny_llama: Path) -> None:
    with ServeProcess(*tiny_args(tiny_llama, "--max-body", "2000", "--api-key", KEY)) as srv:
        with pytest.raises(openai.APIStatusError) as big:
            msgs = [{"role": "user", "content": "x" * 5000}]
            await client(srv.url).chat.completions.create(model="t", messages=msgs)  # type: ignore[arg-type]
        assert big.value.status_code == 413
        assert (await metrics(srv.url))['turnstile_requests_total{outcome="completed"}'] == 0


async def test_queue_full_is_429(tiny_llama: Path) -> None:
    with ServeProcess(*tiny_args(tiny_llama, "--max-queued", "1", "--api-key", KEY)) as srv:
        oai = client(srv.url)
        stream = await oai.chat.completions.create(model="t", messages=HI, stream=True, **LONG)  # type: ignore[arg-type]
        async with stream:
            await first_chunk(stream)  # the long request runs
            results: dict[str, Any] = {}
            async with anyio.create_task_group() as tg:

                async def queued() -> None:
                    results["b"] = await oai.chat.completions.create(model="t", messages=HI, max_tokens=4)  # type: ignore[arg-type]

                tg.start_soon(queued)
                await until_queued(srv.url, 1)
                with pytest.raises(openai.RateLimitError) as full:
                    await oai.chat.completions.create(model="t", messages=HI, max_tokens=4)  # type: ignore[arg-type]
                assert full.value.status_code == 429 and full.value.response.headers["retry-after"] == "1"
                assert full.value.body == {  # type: ignore[comparison-overlap]
                    "message": "the server is busy: 1 requests are already queued (max_queued=1)",
                    "type": "rate_limit_error",
                    "code": "queue_full",
                    "param": None,
                }
                await stream.close()  # the long one leaves: the queued one runs
        assert results["b"].choices[0].finish_reason in ("stop", "length")
        m = await metrics(srv.url)
        assert m['turnstile_requests_total{outcome="rejected"}'] == 1


async def test_client_leaving_mid_stream_stops_the_request(tiny_llama: Path, tmp_path: Path) -> None:
    with ServeProcess(*tiny_args(tiny_llama, "--data-dir", tmp_path, "--api-key", KEY)) as srv:
        oai = client(srv.url, default_headers={"X-Session-Id": "dc"})
        first = await oai.chat.completions.create(model="t", messages=HI, max_tokens=6, temperature=0)  # type: ignore[arg-type]
        reply = first.choices[0].message.content or ""
        history = [*HI, {"role": "assistant", "content": reply}, {"role": "user", "content": "Another one."}]
        stream = await oai.chat.completions.create(model="t", messages=history, stream=True, **LONG)  # type: ignore[arg-type]
        await first_chunk(stream)
        await stream.close()  # the client leaves mid-stream
        # a stateless request queues behind the one that was running: when it returns, that one has ended
        await client(srv.url).chat.completions.create(model="t", messages=HI, max_tokens=2)  # type: ignore[arg-type]
        m = await metrics(srv.url)
        assert m['turnstile_requests_total{outcome="cancelled"}'] == 1
        assert m['turnstile_requests_total{outcome="completed"}'] == 2
        assert m["turnstile_client_disconnects_total"] == 1
        assert m['turnstile_tokens_total{kind="generated"}'] < 6 + 2 + 900  # it stopped early
    assert srv.returncode == 0
    store = DiskStore(tmp_path / "sessions")
    try:
        session = store.get("dc")
    finally:
        store.close()
    assert [(m.role, m.content) for m in session.messages] == [("user", "Name a colour."), ("assistant", reply)]


async def test_sigterm_drains(tiny_llama: Path, tmp_path: Path) -> None:
    srv = ServeProcess(*tiny_args(tiny_llama, "--data-dir", tmp_path, "--api-key", KEY))
    with srv:
        oai = client(srv.url)
        stream = await oai.chat.completions.create(
            model="t",
            messages=HI,
            stream=True,
            stream_options={"include_usage": True},
            **LONG,  # type: ignore[arg-type]
        )
        it, _ = await first_chunk(stream)
        results: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def queued() -> None:
                try:
                    await oai.chat.completions.create(model="t", messages=HI, max_tokens=4)  # type: ignore[arg-type]
                except openai.APIStatusError as e:
                    results["queued"] = e

            tg.start_soon(queued)
            await until_queued(srv.url, 1)
            srv.terminate()
            finish, usage = None, None
            async for chunk in it:  # the running request finishes
                if chunk.choices:
                    finish = chunk.choices[0].finish_reason or finish
                usage = chunk.usage or usage
        assert finish == "length" and usage is not None and usage.completion_tokens == 900
        assert results["queued"].status_code == 503
        assert srv.wait() == 0
    assert any((tmp_path / "states").rglob("*")), "the slot's state was flushed to the disk tier"


async def test_session_survives_a_restart_from_the_disk_tier(tiny_llama: Path, tmp_path: Path) -> None:
    turn2 = [*HI, {"role": "assistant", "content": ""}, {"role": "user", "content": "And another?"}]
    # the control: both turns in one process (the second turn's prefix comes from the slot)
    async with Runtime.open(tiny_llama, n_ctx=1024, n_threads=1, n_threads_batch=1) as rt:
        r1 = await rt.complete(HI, temperature=0, max_tokens=6)
        turn2[2]["content"] = r1.text
        control = await rt.complete(turn2, temperature=0, max_tokens=6)
    assert control.cache_source == "slot"

    headers = {"X-Session-Id": "restart"}
    args = tiny_args(tiny_llama, "--data-dir", tmp_path, "--api-key", KEY)
    with ServeProcess(*args) as srv:
        first = await client(srv.url, default_headers=headers).chat.completions.create(
            model="t",
            messages=HI,
            max_tokens=6,
            temperature=0,  # type: ignore[arg-type]
        )
    assert srv.returncode == 0 and first.choices[0].message.content == r1.text
    with ServeProcess(*args) as srv:
        second = await client(srv.url, default_headers=headers).chat.completions.create(
            model="t",
            messages=turn2,
            max_tokens=6,
            temperature=0,  # type: ignore[arg-type]
        )
    u = second.usage
    assert u is not None and u.prompt_tokens_details is not None
    assert (second.model_extra or {})["timings"]["cache_source"] == "disk"
    assert u.prompt_tokens_details.cached_tokens == control.usage.cached_tokens >= first.usage.prompt_tokens  # type: ignore[union-attr]
    assert second.choices[0].message.content == control.text
    store = DiskStore(tmp_path / "sessions")
    try:
        contents = [m.content for m in store.get("restart").messages]
    finally:
        store.close()
    assert contents == ["Name a colour.", r1.text, "And another?", control.text]


@pytest.mark.slow
async def test_default_model_answers_as_in_process(smollm2_path: Path) -> None:
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    with ServeProcess("--threads", "2", "--ctx", "2048") as srv:  # no --model: SmolLM2
        r = await client(srv.url).chat.completions.create(model="smollm2", messages=msgs, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    assert srv.returncode == 0 and r.model == smollm2_path.name
    async with Runtime.open(smollm2_path, n_ctx=2048, n_threads=2, n_threads_batch=2) as rt:
        want = await rt.complete(msgs, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == want.text and want.text
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        want.usage.prompt_tokens,
        want.usage.generated_tokens,
    )


async def test_second_turn_reuses_the_whole_first_turn(smollm2_path: Path) -> None:
    """The conversation resent whole with one more message: the first turn's prompt and completion tokens (its
    <|im_end|>, or its last token at max_tokens) all come from the slot (turnstile's rules commit the last one)."""
    with ServeProcess("--model", smollm2_path, "--threads", "2", "--ctx", "2048") as srv:
        oai = client(srv.url)
        for max_tokens, finish in ((64, "stop"), (5, "length")):
            one = await oai.chat.completions.create(model="m", messages=HI, max_tokens=max_tokens, temperature=0)  # type: ignore[arg-type]
            assert one.choices[0].finish_reason == finish and one.usage is not None
            assert one.usage.total_tokens == one.usage.prompt_tokens + one.usage.completion_tokens
            msgs = [
                *HI,
                {"role": "assistant", "content": one.choices[0].message.content},
                {"role": "user", "content": "Why?"},
            ]
            two = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)  # type: ignore[arg-type]
            assert two.usage is not None and two.usage.prompt_tokens_details is not None
            assert two.usage.prompt_tokens_details.cached_tokens == one.usage.total_tokens  # exactly
    assert srv.returncode == 0


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.slow
async def test_tools_round_trip_and_json_schema(smollm2_path: Path) -> None:
    with ServeProcess("--model", smollm2_path, "--threads", "2", "--ctx", "2048", "--api-key", KEY) as srv:
        oai = client(srv.url)
        msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
        r = await oai.chat.completions.create(
            model="t",
            messages=msgs,
            tools=[TOOL],
            tool_choice="required",
            max_tokens=64,
            temperature=0,  # type: ignore[list-item]
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
        import json

        assert isinstance(json.loads(call.function.arguments), dict)  # type: ignore[union-attr]
        msgs += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        r2 = await oai.chat.completions.create(model="t", messages=msgs, tools=[TOOL], tool_choice="none", max_tokens=8)  # type: ignore[list-item]
        assert r2.choices[0].finish_reason in ("stop", "length") and not r2.choices[0].message.tool_calls

        stream = await oai.chat.completions.create(
            model="t",
            messages=msgs[:1],
            tools=[TOOL],
            tool_choice="required",
            max_tokens=64,
            temperature=0,
            stream=True,  # type: ignore[list-item]
        )
        deltas = [c.choices[0] async for c in stream if c.choices]
        streamed = [tc for d in deltas for tc in d.delta.tool_calls or []]
        assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]
        # the call's first chunk names it (arguments ""), the rest carry its arguments in pieces
        assert streamed[0].id and streamed[0].index == 0 and streamed[0].function.name == "get_weather"  # type: ignore[union-attr]
        assert all(tc.index == 0 and tc.function.name is None for tc in streamed[1:])  # type: ignore[union-attr]
        assert "".join(tc.function.arguments or "" for tc in streamed) == call.function.arguments  # type: ignore[union-attr]

        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        r3 = await oai.chat.completions.create(
            model="t",
            messages=[{"role": "user", "content": "A number?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
            max_tokens=32,
            temperature=0,
        )
        value = json.loads(r3.choices[0].message.content or "")
        assert isinstance(value["n"], int)


ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, url: str, *args: str) -> str:
    cmd = [sys.executable, str(ROOT / "examples" / name), "--base-url", url + "/v1", *args]
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "TURNSTILE_API_KEY": KEY}
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_examples_run_against_the_server(tiny_llama: Path) -> None:
    with ServeProcess(*tiny_args(tiny_llama, "--api-key", KEY)) as srv:
        out = run_example("openai_client.py", srv.url, "--max-tokens", "4")
        turns = [(int(p), int(c)) for p, c in re.findall(r"\[(\d+) prompt tokens, (\d+) cached\]", out)]
        assert out.startswith("one-off: ") and "\nstreamed: " in out and len(turns) == 3
        assert all(c > turns[i][0] // 2 for i, (_, c) in enumerate(turns[1:]))  # the history comes from the cache
        if importlib.util.find_spec("agents") is not None:
            out = run_example("agents_sdk.py", srv.url, "--max-tokens", "4")
            assert [line.split(":")[0] for line in out.splitlines()[:3]] == [
                "writer",
                "critic",
                "writer",
            ] or "writer:" in out
            found = re.search(r"\[revision: (\d+) prompt tokens, (\d+) cached\]", out)
            assert found is not None and int(found[2]) > 0


def test_http_benchmark_runs(tmp_path: Path) -> None:
    from benchmarks import http

    http.main(["--requests", "5", "--clients", "4", "--per-client", "2", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "http.json").read_text())
    rows = doc["rows"]
    assert [(r["mode"], r["client"]) for r in rows] == [
        ("complete", "in-process"),
        ("stream", "in-process"),
        ("complete", "raw"),
        ("stream", "raw"),
        ("complete", "httpx"),
        ("stream", "httpx"),
        ("complete", "openai"),
        ("stream", "4 concurrent"),
    ]
    assert all(r["errors"] == 0 for r in rows) and rows[-1]["requests"] == 8
