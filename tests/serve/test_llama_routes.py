"""llama-server's routes and fields on the scripted backend (in process, httpx's ASGI transport): CORS
preflights answered before the key check, /completion and /v1/completions shapes (plain and streamed),
the fields refused with a 400 naming them, /props /slots /models /v1/health, the un-prefixed OpenAI paths,
and the thinking-off generation prompt of /apply-template. The same routes on a real model, against
llama-server, are in tests/serve/test_llama_completion_oracle.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.reasoning.formats import COMMAND_R7B, THINK, thinking_off_prefill
from runtime.serve.http import app as make_app
from runtime.serve.http.llama.cors import allowed_origin
from runtime.serve.http.llama.options import LlamaOptions
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

KEY = "sk-test"


@asynccontextmanager
async def served(**llama: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with Runtime.serve(ScriptedBackend(n_ctx=400), MemoryStore()) as rt:
        application = make_app(rt, api_key=KEY, model_name="tiny", llama=LlamaOptions(**llama))
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c


AUTH = {"Authorization": f"Bearer {KEY}"}
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


async def test_preflight_is_answered_before_the_key_check() -> None:
    async with served(cors_origins=("http://page.example",)) as c:
        r = await c.options("/v1/chat/completions", headers={"Origin": "http://page.example", **PREFLIGHT})
        assert r.status_code == 200 and r.content == b""
        assert r.headers["access-control-allow-origin"] == "http://page.example"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "x-api-key", "content-type", "x-session-id"} <= allowed
        # another origin: answered, but without the header a browser needs
        r = await c.options("/v1/chat/completions", headers={"Origin": "http://evil.example", **PREFLIGHT})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
        # the real request still needs the key, and carries the origin header
        r = await c.get("/v1/models", headers={"Origin": "http://page.example"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://page.example"
        r = await c.get("/v1/models", headers={"Origin": "http://page.example", **AUTH})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://page.example"


async def test_no_cors_origins_means_no_cors() -> None:
    async with served() as c:
        r = await c.options("/v1/chat/completions", headers={"Origin": "http://page.example", **PREFLIGHT})
        assert r.status_code == 401 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize(
    ("origins", "origin", "allowed"),
    [
        (("*",), "http://any.where", "http://any.where"),
        (("localhost",), "http://localhost:3000", "http://localhost:3000"),
        (("localhost",), "http://[::1]:3000", "http://[::1]:3000"),
        (("localhost",), "http://localhost.evil.com", None),
        (("localhost",), "http://127.0.0.1.evil.com", None),
        (("http://a.b", "http://c.d"), "http://c.d", "http://c.d"),
        (("http://a.b",), "http://a.b.evil", None),
        (("*",), None, None),
    ],
)
def test_allowed_origin(origins: tuple[str, ...], origin: str | None, allowed: str | None) -> None:
    assert allowed_origin(origins, origin) == allowed


async def test_completion_native_shape() -> None:
    async with served(sampling={"seed": 42, "max_tokens": 64}) as c:
        r = await c.post("/completion", json={"prompt": [5, 6, 7], "n_predict": 4, "return_tokens": True}, headers=AUTH)
        assert r.status_code == 200, r.text
        body = r.json()
        # the scripted backend answers "echo: " + the prompt's text, each character a token
        assert body["content"] == "echo:"
        assert body["tokens"] == [ord(ch) for ch in "echo:"]
        assert body["tokens_evaluated"] == 3 and body["tokens_predicted"] == 5
        assert body["stop"] is True and body["stop_type"] == "eos" and body["truncated"] is False
        assert body["generation_settings"]["n_predict"] == 4 and body["generation_settings"]["seed"] == 42
        assert body["id_slot"] == 0 and body["tokens_cached"] == 8 and body["timings"]["predicted_n"] == 5


async def test_completions_openai_shape_and_stream() -> None:
    async with served() as c:
        r = await c.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 8, "echo": True}, headers=AUTH)
        body = r.json()
        assert body["object"] == "text_completion" and body["system_fingerprint"].startswith("b")
        assert body["choices"][0]["text"] == "\x05\x06echo:" and body["choices"][0]["finish_reason"] == "stop"
        usage = {
            "prompt_tokens": 2,
            "completion_tokens": 5,
            "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        assert body["usage"] == usage
        r = await c.post("/v1/completions", json={"prompt": [5, 6], "stream": True}, headers=AUTH)
        events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == "echo:"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        r = await c.post("/completion", json={"prompt": [5, 6], "stream": True}, headers=AUTH)
        native = [json.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n") if e]
        assert [n["stop"] for n in native] == [False] * (len(native) - 1) + [True]
        assert "".join(n["content"] for n in native) == "echo:" and native[-1]["tokens_predicted"] == 5


async def test_several_prompts_get_one_answer_each() -> None:
    async with served() as c:
        r = await c.post("/completion", json={"prompt": [[5], [6, 7]]}, headers=AUTH)
        assert [b["tokens_evaluated"] for b in r.json()] == [1, 2] and [b["index"] for b in r.json()] == [0, 1]


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/completion", "n_probs", 3),
        ("/completion", "logit_bias", [[5, -100]]),
        ("/completion", "mirostat", 2),
        ("/completion", "samplers", ["top_k"]),
        ("/v1/completions", "logprobs", 2),
        ("/v1/chat/completions", "logit_bias", {"5": -100}),
        ("/v1/chat/completions", "logprobs", True),
        ("/v1/chat/completions", "typical_p", 0.5),
        ("/v1/chat/completions", "xtc_probability", 0.5),
        ("/chat/completions", "dry_multiplier", 0.8),
        ("/chat/completions", "n", 2),
    ],
)
async def test_fields_that_would_change_the_reply_are_refused(path: str, field: str, value: Any) -> None:
    body: dict[str, Any] = {field: value}
    body |= {"prompt": [5]} if "chat" not in path else {"messages": [{"role": "user", "content": "hi"}]}
    async with served() as c:
        r = await c.post(path, json=body, headers=AUTH)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("neutral", [{"logprobs": False}, {"typical_p": 1.0}, {"n": 1}, {"logit_bias": {}}])
async def test_neutral_values_are_accepted(neutral: dict[str, Any]) -> None:
    async with served() as c:
        body = {"messages": [{"role": "user", "content": "hi"}], **neutral}
        assert (await c.post("/chat/completions", json=body, headers=AUTH)).status_code == 200


async def test_bad_completion_requests_are_400() -> None:
    async with served() as c:
        for body in ({}, {"prompt": 5}, {"prompt": [5], "id_slot": 3}, {"prompt": [5], "grammar": 1}):
            assert (await c.post("/completion", json=body, headers=AUTH)).status_code == 400, body


async def test_props_slots_models_health() -> None:
    async with served(slots=False, aliases=("tiny", "b"), tags=("chat",)) as c:
        props = (await c.get("/props", headers=AUTH)).json()
        assert props["default_generation_settings"]["n_ctx"] == 400 and props["total_slots"] == 1
        assert props["model_alias"] == "tiny" and props["endpoint_slots"] is False
        r = await c.get("/slots", headers=AUTH)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert (await c.post("/props", json={}, headers=AUTH)).status_code == 501
        assert (await c.post("/slots/0?action=save", json={}, headers=AUTH)).status_code == 501
        for path in ("/models", "/v1/models"):
            body = (await c.get(path, headers=AUTH)).json()
            assert body["data"][0]["id"] == "tiny" and body["data"][0]["aliases"] == ["tiny", "b"]
            assert body["data"][0]["tags"] == ["chat"] and body["models"][0]["name"] == "tiny"
        assert (await c.get("/v1/health")).json() == {"status": "ok"}  # public, as /health
    async with served() as c:
        slots = (await c.get("/slots", headers=AUTH)).json()
        assert [s["id"] for s in slots] == [0] and slots[0]["n_ctx"] == 400


async def test_unprefixed_openai_paths() -> None:
    async with served() as c:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        r = await c.post("/chat/completions", json=body, headers=AUTH)
        assert r.json()["choices"][0]["message"]["content"] == "echo: hi"
        r = await c.post("/responses", json={"input": "hi"}, headers=AUTH)
        assert r.status_code == 200 and r.json()["object"] == "response"


async def test_server_sampling_defaults_and_request_values() -> None:
    async with served(sampling={"max_tokens": 1, "seed": 7}) as c:
        r = await c.post("/completion", json={"prompt": [5], "n_predict": 8}, headers=AUTH)
        settings = r.json()["generation_settings"]
        assert (settings["n_predict"], settings["seed"]) == (1, 7)  # the server's n_predict is a ceiling
        r = await c.post("/completion", json={"prompt": [5], "seed": 3, "temperature": 0.0}, headers=AUTH)
        settings = r.json()["generation_settings"]
        assert (settings["n_predict"], settings["seed"], settings["temperature"]) == (1, 3, 0.0)


def test_thinking_off_prefill() -> None:
    assert thinking_off_prefill("<|im_start|>assistant\n<think>\n", THINK) == "<|im_start|>assistant\n<think>\n</think>"
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's switch already closed it
    assert thinking_off_prefill(closed, THINK) == closed
    r7b = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    assert thinking_off_prefill(r7b, COMMAND_R7B) == r7b + "<|START_THINKING|><|END_THINKING|>"
    assert thinking_off_prefill("plain", None) == "plain"


def test_several_hosts_share_one_port() -> None:
    from runtime.errors import BindError
    from runtime.serve.http.server import bind, bind_all

    socks = bind_all("127.0.0.1, 127.0.0.2", 0)  # the whole 127/8 is loopback on Linux
    try:
        assert [s.getsockname()[0] for s in socks] == ["127.0.0.1", "127.0.0.2"]
        assert socks[0].getsockname()[1] == socks[1].getsockname()[1] != 0
    finally:
        for s in socks:
            s.close()
    taken = bind("127.0.0.1", 0)
    try:
        with pytest.raises(BindError):  # the second address is taken: nothing stays bound
            bind_all("127.0.0.3,127.0.0.1", taken.getsockname()[1])
        bind("127.0.0.3", taken.getsockname()[1]).close()
    finally:
        taken.close()


async def test_metrics_with_llama_server_names_and_switchable() -> None:
    async with served() as c:
        await c.post("/completion", json={"prompt": [5, 6]}, headers=AUTH)
        lines = set((await c.get("/metrics", headers=AUTH)).text.splitlines())
        assert {"llamacpp:tokens_predicted_total 5", "llamacpp:requests_processing 0"} <= lines
        assert "turnstile_ready 1" in lines
    async with served(metrics=False) as c:
        r = await c.get("/metrics", headers=AUTH)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
