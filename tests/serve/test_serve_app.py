"""The HTTP app in-process on the scripted backend: request and reply shapes, every error status, sessions,
and clients that leave (driven through httpx's ASGI transport, or the raw ASGI interface, no server)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx2 as httpx
import pytest

from runtime import Reply
from runtime.errors import SessionNotFound
from runtime.serve.http import app as make_app
from runtime.testing import ScriptedBackend
from tests.conftest import Scripted
from tests.support.raw_asgi import RawClient

HI = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]


@pytest.fixture
def scripted_backend() -> Callable[[], ScriptedBackend]:
    return lambda: ScriptedBackend(n_ctx=400)


def client(application: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://test")


async def post(application: Any, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    async with client(application) as c:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await c.post("/v1/chat/completions", content=content, headers=headers or {})


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code", "param"} <= set(body["error"]), body
    err: dict[str, Any] = body["error"]
    return err


async def test_chat_completion_shape(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        r = await post(make_app(rt), {"model": "anything", "messages": HI, "max_tokens": 5})
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "chat.completion" and body["model"] == "scripted"
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "echo: hi there", "tool_calls": None}
        assert body["choices"][0]["finish_reason"] == "stop"
        prompt = len("system: Be brief.\nuser: hi there\nassistant: ")
        assert body["usage"] == {
            "prompt_tokens": prompt,
            "completion_tokens": len("echo: hi there"),
            "total_tokens": prompt + len("echo: hi there"),
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        t = body["timings"]
        assert (t["cache_n"], t["prompt_n"], t["predicted_n"], t["cache_source"]) == (0, prompt, 14, "none")
        again = (await post(make_app(rt), {"messages": HI})).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1  # the slot holds it
        assert again["timings"]["cache_n"] == prompt - 1


async def test_sampling_fields_reach_the_runtime(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        r = await post(make_app(rt), {"messages": HI, "max_completion_tokens": 2, "max_tokens": 50, "stop": "x"})
        assert r.json()["choices"][0] == {
            "index": 0,
            "message": {"role": "assistant", "content": "echo: hi", "tool_calls": None},
            "finish_reason": "length",
            "logprobs": None,
        }
        fields = {
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "min_p": 0.1,
            "seed": 7,
            "presence_penalty": 1,
            "frequency_penalty": 0.5,
            "repeat_penalty": 1.1,
            "stop": ["a", "b"],
            "n": 1,
            "user": "u-1",
        }
        assert (await post(make_app(rt), {"messages": HI, **fields})).status_code == 200


async def test_stream_chunks_and_usage(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        async with client(make_app(rt)) as c:
            body = {"messages": HI, "stream": True, "stream_options": {"include_usage": True}}
            r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = r.text.split("\n\n")  # the role-only first chunk goes out when the slot starts the turn
        assert events[-2:] == ["data: [DONE]", ""]
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert deltas[0] == {"role": "assistant", "content": None}  # role-only first chunk, as llama-server
        assert deltas[1] == {"content": "echo:"}
        assert "".join(d.get("content") or "" for d in deltas) == "echo: hi there"
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
        assert chunks[-2]["timings"]["predicted_n"] == 14
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 14
        assert len({c["id"] for c in chunks}) == 1


async def test_stream_without_usage_ends_with_the_finish_chunk(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        r = await post(make_app(rt), {"messages": HI, "stream": True})
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "stop" and last["usage"] is None


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, None),
        (b"", None, None),
        (b"[1, 2]", None, None),
        ({"messages": "hi"}, None, None),
        ({"messages": []}, "messages", None),
        ({"messages": HI, "temperature": "hot"}, None, None),
        ({"messages": HI, "temperature": -1}, "temperature", "invalid_value"),
        ({"messages": HI, "top_p": 0}, "top_p", "invalid_value"),
        ({"messages": HI, "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"messages": HI, "n": 2}, "n", None),
        ({"messages": HI, "stop": [""]}, "stop", "invalid_value"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, None, "invalid_value"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, None, "invalid_value"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages", None),
        ({"messages": HI, "user": "not a valid id!"}, None, "invalid_value"),
        ({"messages": [{"role": "user", "content": "x" * 500}]}, "messages", "context_length_exceeded"),
    ],
)
async def test_bad_input_is_400(scripted: Scripted, body: Any, param: str | None, code: str | None) -> None:
    async with scripted(max_queued=1) as (rt, _):
        for stream in (False, True):
            payload = body if isinstance(body, bytes) or not isinstance(body, dict) else {**body, "stream": stream}
            r = await post(make_app(rt), payload)
            assert r.status_code == 400, r.text
            err = error_of(r)
            # a prompt too long has llama-server's type (and its n_prompt_tokens, n_ctx), OpenAI's code
            overflow = code == "context_length_exceeded"
            assert err["type"] == ("exceed_context_size_error" if overflow else "invalid_request_error")
            assert (err["param"], err["code"]) == (param, code), err
            if overflow:
                assert (err["n_prompt_tokens"], err["n_ctx"]) == (518, 400)
        assert await rt.list_sessions() == []


async def test_text_content_parts_are_joined(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        parts = [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]
        r = await post(
            make_app(rt), {"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": parts}]}
        )
        assert r.json()["choices"][0]["message"]["content"] == "echo: hi there"


async def test_api_key(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        application = make_app(rt, api_key="s3cret")
        async with client(application) as c:
            assert (await c.get("/health")).status_code == 200  # public
            for headers, code in (({}, "missing_api_key"), ({"Authorization": "Bearer nope"}, "invalid_api_key")):
                for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/metrics")):
                    r = await c.request(method, path, headers=headers, json={"messages": HI})
                    assert r.status_code == 401 and error_of(r)["code"] == code
            r = await c.post("/v1/chat/completions", json={"messages": HI}, headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == 200
        assert rt.stats().scheduler.submitted == 1


async def test_body_over_the_limit_is_413(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        application = make_app(rt, max_body_bytes=100)
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 200}]}).encode()
        r = await post(application, big)
        assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: judged by the bytes as they come
            for i in range(0, len(big), 40):
                yield big[i : i + 40]

        async with client(application) as c:
            r = await c.post("/v1/chat/completions", content=chunks())
        assert "content-length" not in r.request.headers and r.status_code == 413
        assert rt.stats().scheduler.submitted == 0


async def test_models_health_metrics_and_404(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        async with client(make_app(rt, model_name="tiny")) as c:
            models = (await c.get("/v1/models")).json()
            assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
            meta = models["data"][0]["meta"]
            assert {k: meta[k] for k in ("n_vocab", "n_ctx", "n_ctx_train")} == {
                "n_vocab": 0,
                "n_ctx": 400,
                "n_ctx_train": 400,
            }
            assert (meta["n_gpu_layers"], meta["type_k"], meta["type_v"]) == (0, "f16", "f16")  # scripted: no vocab
            assert models["models"][0]["name"] == "tiny"  # llama-server's list beside OpenAI's
            await c.post("/v1/chat/completions", json={"messages": HI})
            await c.post("/v1/chat/completions", json={"messages": HI, "n": 3})
            text = (await c.get("/metrics")).text
            r = await c.get("/nowhere")
            assert r.status_code == 404 and error_of(r)["type"] == "not_found_error"
            assert (await c.get("/v1/chat/completions")).status_code == 405
        lines = set(text.splitlines())
        assert {
            "turnstile_ready 1",
            'turnstile_http_responses_total{path="/v1/chat/completions",status="200"} 1',
            'turnstile_http_responses_total{path="/v1/chat/completions",status="400"} 1',
            'turnstile_requests_total{outcome="completed"} 1',
            "turnstile_queue_depth 0",
            "turnstile_prefill_pauses_total 0",
            "turnstile_prefill_aborts_total 0",
            "turnstile_prefill_aborted_tokens_total 0",
            'turnstile_tokens_total{kind="generated"} 14',
            "# TYPE turnstile_requests_total counter",
        } <= lines, text


async def test_loading_is_503() -> None:
    application = make_app(None)
    async with client(application) as c:
        for r in (await c.get("/health"), await c.post("/v1/chat/completions", json={"messages": HI})):
            assert r.status_code == 503 and error_of(r)["type"] == "unavailable_error"
        assert "turnstile_ready 0" in (await c.get("/metrics")).text


async def test_session_header_or_user_names_a_session(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        application = make_app(rt)
        r = await post(application, {"messages": HI, "user": "ignored"}, {"X-Session-Id": "s1"})
        assert r.status_code == 200
        r = await post(application, {"messages": HI, "user": "u2"})
        session = await rt.get_session("s1")
        assert session.system == "Be brief."
        assert [(m.role, m.content) for m in session.messages] == [
            ("user", "hi there"),
            ("assistant", "echo: hi there"),
        ]
        assert [m.content for m in (await rt.get_session("u2")).messages] == ["hi there", "echo: hi there"]
        await post(application, {"messages": HI})  # stateless: nothing stored
        r = await post(application, {"messages": HI, "user": "", "stream_options": {"include_usage": None}})
        assert r.status_code == 200
        assert sorted(await rt.list_sessions()) == ["s1", "u2"]


async def test_queue_full_is_429_and_closing_is_503(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        backend = rt.backend
        assert isinstance(backend, ScriptedBackend)
        gate = backend.hold("a")
        application = make_app(rt)
        results: dict[str, httpx.Response] = {}

        async def send(name: str) -> None:
            results[name] = await post(application, {"messages": HI}, {"X-Session-Id": name})

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, "a")
            await gate.arrived()  # "a" runs
            tg.start_soon(send, "b")
            with anyio.fail_after(10):
                while rt.stats().scheduler.queued < 1:  # "b" waits in the queue (max_queued=1)
                    await anyio.lowlevel.checkpoint()
            r = await post(application, {"messages": HI})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert error_of(r) == {
                "message": "the server is busy: 1 requests are already queued (max_queued=1)",
                "type": "rate_limit_error",
                "code": "queue_full",
                "param": None,
            }
            tg.start_soon(rt.aclose)  # closing: "b" gets 503, "a" finishes
            with anyio.fail_after(10):
                while "b" not in results:
                    await anyio.lowlevel.checkpoint()
            gate.open()
        assert results["b"].status_code == 503 and error_of(results["b"])["type"] == "unavailable_error"
        assert results["a"].status_code == 200
        assert (await post(application, {"messages": HI})).status_code == 503


async def test_request_timeout_is_504(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        backend = rt.backend
        assert isinstance(backend, ScriptedBackend)
        backend.hold("slow")  # never opened: the request can only end by its timeout
        r = await post(make_app(rt, request_timeout=0.05), {"messages": HI}, {"X-Session-Id": "slow"})
        assert r.status_code == 504 and error_of(r)["type"] == "timeout_error"
        with pytest.raises(SessionNotFound):
            await rt.get_session("slow")


# --- clients that leave ---------------------------------------------------------------------------------

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_while_running_stops_its_request(scripted: Scripted, stream: bool) -> None:
    async with scripted(max_queued=1) as (rt, _):
        backend = rt.backend
        assert isinstance(backend, ScriptedBackend)
        application = make_app(rt)
        gate = backend.hold("d")
        c = RawClient(CHAT, {"messages": HI, "stream": stream}, "d")
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run, application)
            await gate.arrived()
            c.leave()
        # nothing was answered (a stream was opened when the slot started the turn: the role alone, no text)
        bodies = [m.get("body") for m in c.sent if m["type"] == "http.response.body"]
        assert len(bodies) == (1 if stream else 0) and len(c.sent) == (2 if stream else 0)
        if stream:
            first = json.loads(bodies[0].decode().removeprefix("data: "))
            assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
        st = rt.stats().scheduler
        assert (st.cancelled, st.completed) == (1, 0)
        with pytest.raises(SessionNotFound):
            await rt.get_session("d")
        assert application.state.turnstile.disconnects == 1


async def test_a_client_that_leaves_while_queued_is_removed(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        backend = rt.backend
        assert isinstance(backend, ScriptedBackend)
        application = make_app(rt)
        gate = backend.hold("a")
        running, queued = RawClient(CHAT, {"messages": HI}, "a"), RawClient(CHAT, {"messages": HI, "stream": True}, "q")
        async with anyio.create_task_group() as tg:
            tg.start_soon(running.run, application)
            await gate.arrived()
            tg.start_soon(queued.run, application)
            with anyio.fail_after(10):
                while rt.stats().scheduler.queued < 1:
                    await anyio.lowlevel.checkpoint()
            queued.leave()
            with anyio.fail_after(10):
                while rt.stats().scheduler.queued:
                    await anyio.lowlevel.checkpoint()
            gate.open()
        assert backend.runs == ["a"] and queued.sent == []
        assert running.sent[0]["status"] == 200
        assert await rt.list_sessions() == ["a"]


async def test_a_client_that_leaves_mid_stream_commits_nothing(scripted: Scripted) -> None:
    async with scripted(max_queued=1) as (rt, _):
        backend = rt.backend
        assert isinstance(backend, ScriptedBackend)
        words = " ".join(f"w{i}" for i in range(50))
        backend.reply = lambda _m: words
        application = make_app(rt)
        await rt.complete(HI, session_id="m")
        before = await rt.get_session("m")
        # the stream's first piece reaches the client; the client leaves before the reply is complete
        c = RawClient(
            CHAT,
            {
                "messages": [*HI, {"role": "assistant", "content": words}, {"role": "user", "content": "more"}],
                "stream": True,
                "max_tokens": 50,
            },
            "m",
        )
        gate = backend.hold("m")
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run, application)
            await gate.arrived()
            gate.open()
            await c.first_body.wait()
            c.leave()
        after = await rt.get_session("m")
        assert after == before
        assert application.state.turnstile.disconnects == 1


async def test_tool_fields_that_ask_for_nothing_are_dropped_and_unknown_formats_are_400(
    scripted: Scripted,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with scripted(max_queued=1) as (rt, _):
        seen: list[dict[str, Any]] = []
        real = rt.complete

        async def spy(messages: list[dict[str, Any]], **kw: Any) -> Reply:
            seen.append(kw)
            return await real(messages, session_id=kw.get("session_id"))

        monkeypatch.setattr(rt, "complete", spy)
        nothing = {"tools": [], "tool_choice": "required", "response_format": {"type": "text"}}
        r = await post(make_app(rt), {"messages": HI, **nothing})
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == "echo: hi there"
        assert seen == [{"session_id": None, "timeout": None}]  # no tools, tool_choice or response_format
        for fmt, message in (
            ({"type": "xml"}, "response_format type 'xml' is not supported"),
            (
                {"type": "json_schema", "json_schema": {"name": "x"}},
                "response_format.json_schema.schema must be an object",
            ),
        ):
            r = await post(make_app(rt), {"messages": HI, "response_format": fmt})
            assert r.status_code == 400
            err = error_of(r)
            assert (err["param"], err["message"]) == ("response_format", message)
        assert len(seen) == 1  # refused before the Runtime was called


async def test_tool_fields_are_passed_to_the_runtime(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    async with scripted(max_queued=1) as (rt, _):
        seen: dict[str, Any] = {}
        real = rt.complete

        async def spy(messages: list[dict[str, Any]], **kw: Any) -> Reply:
            seen.update(kw)
            seen["messages"] = messages
            return await real(messages, session_id=kw.get("session_id"))

        monkeypatch.setattr(rt, "complete", spy)
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        history = [
            *HI,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ]
        body = {
            "messages": history,
            "tools": [tool],
            "tool_choice": "required",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        }
        r = await post(make_app(rt), body)
        assert r.status_code == 200
        assert seen["tools"] == [tool] and seen["tool_choice"] == "required" and seen["response_format"] == schema
        assert seen["messages"][2]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
        assert seen["messages"][3] == {"role": "tool", "content": "42", "tool_call_id": "c1"}


def test_the_asgi_helpers_load_no_framework() -> None:
    """`runtime.serve.asgi` is shared by the HTTP app, the Ray relay and the router: it loads none of them."""
    code = (
        "import sys, runtime.serve.asgi; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'uvicorn', 'ray', 'llama_cpp', 'anyio'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_error_mapping() -> None:
    from runtime.errors import (
        ContextOverflow,
        InvalidSampling,
        LlamaDecodeError,
        QueueFull,
        ReplyMismatch,
        RequestTimeout,
        RuntimeClosed,
        StoreUnavailable,
    )
    from runtime.serve.http.errors import to_api_error

    cases = [
        (ContextOverflow(10, 5), 400, "context_length_exceeded"),
        (InvalidSampling("top_k", -1, "must be >= 0"), 400, "invalid_value"),
        (QueueFull("full"), 429, "queue_full"),
        (RuntimeClosed("closed"), 503, "unavailable"),
        (StoreUnavailable("/x", "read-only"), 503, "unavailable"),
        (RequestTimeout("slow"), 504, "request_timeout"),
        (ReplyMismatch("not JSON"), 500, "invalid_model_output"),
        (LlamaDecodeError(-3), 500, "LlamaDecodeError"),
        (RuntimeError("bug"), 500, "internal_error"),
    ]
    assert [(to_api_error(e).status, to_api_error(e).code) for e, _, _ in cases] == [(s, c) for _, s, c in cases]
    assert to_api_error(RuntimeError("secret detail")).message == "internal server error"
