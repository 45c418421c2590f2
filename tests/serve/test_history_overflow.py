"""A history longer than the context gets the context-size error (llama-server's `exceed_context_size_error`
with its numbers), also when it repeats system messages, which turnstile's session model refuses otherwise:
llama.cpp's suite sends `[system, user] * 100` and expects the context error, plain and streamed. A short
history with a second system message keeps the session model's refusal. Scripted backend: what is decided
here is the order of two refusals, before anything is queued."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.serve.http import app as make_app
from runtime.serve.http.llama.options import LlamaOptions
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

TURN = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_long_history_gets_the_context_size_error(stream: bool) -> None:
    backend = ScriptedBackend(n_ctx=400)
    want = len(backend.tokenize(backend.apply_template(TURN * 100), add_special=True))
    async with Runtime.serve(backend, MemoryStore()) as rt:
        application = make_app(rt, model_name="tiny", llama=LlamaOptions())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
            r = await c.post("/chat/completions", json={"messages": TURN * 100, "stream": stream})
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["type"] == "exceed_context_size_error" and err["code"] == "context_length_exceeded"
            assert err["n_prompt_tokens"] == want > 400 and err["n_ctx"] == 400

            r = await c.post("/chat/completions", json={"messages": TURN * 2})
            assert r.status_code == 400
            assert "only the first message may be system" in r.json()["error"]["message"]
        assert rt.stats().scheduler.submitted == 0


@pytest.mark.anyio
async def test_input_tokens_counts_the_prompt() -> None:
    async with Runtime.serve(ScriptedBackend(n_ctx=400), MemoryStore()) as rt:
        application = make_app(rt, model_name="tiny", llama=LlamaOptions())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
            for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
                r = await c.post(path, json={"messages": TURN})
                assert r.status_code == 200
                assert r.json() == {"input_tokens": await rt.count_tokens(TURN), "object": "response.input_tokens"}
                assert r.json()["input_tokens"] > len("What is the best book")
            r = await c.post("/chat/completions/input_tokens", json={"messages": []})
            assert r.status_code == 400
        assert rt.stats().scheduler.submitted == 0
