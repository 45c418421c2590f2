"""The prompt shapes of llama-server's completion route that llama.cpp's suite sends: its JSON prompt
(`{"prompt_string": ...}`), alone and in a list with token ids, answered as the same text would be; one with
multimodal data is refused (no media here). Scripted backend: this is request parsing."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.serve.http import app as make_app
from runtime.serve.http.llama.options import LlamaOptions
from runtime.testing import ScriptedBackend
from sessions import MemoryStore


@pytest.mark.anyio
async def test_json_prompts() -> None:
    async with Runtime.serve(ScriptedBackend(n_ctx=400), MemoryStore()) as rt:
        application = make_app(rt, model_name="tiny", llama=LlamaOptions())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
            plain = (await c.post("/completion", json={"prompt": "hello there"})).json()
            r = await c.post("/completion", json={"prompt": {"prompt_string": "hello there"}})
            assert r.status_code == 200 and r.json()["content"] == plain["content"]
            tokens = (await c.post("/tokenize", json={"content": "hello there"})).json()["tokens"]
            r = await c.post("/completion", json={"prompt": [tokens, {"prompt_string": "hello there"}]})
            assert r.status_code == 200
            assert [x["content"] for x in r.json()] == [plain["content"], plain["content"]]
            media = {"prompt_string": "what is <__media__>", "multimodal_data": ["AAAA"]}
            r = await c.post("/completion", json={"prompt": media})
            assert r.status_code == 400


@pytest.mark.anyio
async def test_completion_timings_are_llama_servers() -> None:
    async with Runtime.serve(ScriptedBackend(n_ctx=400), MemoryStore()) as rt:
        application = make_app(rt, model_name="tiny", llama=LlamaOptions())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
            t = (await c.post("/completion", json={"prompt": "hello there", "n_predict": 3})).json()["timings"]
            assert all(isinstance(v, int | float) and v >= 0 for v in t.values()), t  # no null, no text
            steps = t["predicted_n"] - 1  # the first token comes from the prompt's logits
            assert steps > 0
            ms = t["predicted_ms"]  # the scripted backend may take no measurable time
            assert t["predicted_per_second"] == (pytest.approx(1e3 / ms * steps) if ms > 0 else 0.0)
            assert t["predicted_per_token_ms"] == pytest.approx(ms / steps)
