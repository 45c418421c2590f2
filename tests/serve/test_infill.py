"""llama-server's `/infill` on a tiny model with FIM tokens (written with gguf): the prompt is llama-server's
repo-level FIM layout (checked token by token, with and without extra chunks, cut to the batch 3:1), the
answer is /completion's; a model without FIM tokens gets llama-server's 501, malformed fields its 400s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.model_info import ModelInfo
from runtime.serve.http import app as make_app
from runtime.serve.http.llama.infill import infill_tokens
from runtime.serve.http.llama.options import LlamaOptions
from tests.support.tiny_models import fim_vocab, write_llama


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("fim") / "tiny-fim.gguf", vocab=fim_vocab())


@asynccontextmanager
async def served(model: Path) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    async with Runtime.open(model, n_ctx=512, n_threads=1) as rt:
        application = make_app(rt, model_name="tiny", llama=LlamaOptions())
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=300) as c:
            yield rt, c


@pytest.mark.anyio
async def test_infill_runs_the_fim_prompt(fim_model: Path) -> None:
    pre, suf, mid = fim_vocab().fim or (0, 0, 0)
    async with served(fim_model) as (rt, c):
        assert rt.model_info().fim[:3] == (pre, suf, mid)
        body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))", "prompt": "return"}
        r = await c.post("/infill", json={**body, "n_predict": 4, "temperature": 0.0, "return_tokens": True})
        assert r.status_code == 200, r.text
        out = r.json()
        assert set(out) >= {"content", "tokens", "tokens_evaluated", "stop_type", "timings"}
        plain = [
            await rt.tokenize(body[k], add_special=False, parse_special=False) for k in ("input_prefix", "input_suffix")
        ]
        prompt = await rt.tokenize("return", add_special=False)
        assert out["tokens_evaluated"] == len([pre, *plain[0], *prompt, suf, *plain[1], mid])
        # the same prompt as raw tokens on /completion answers the same
        raw = [pre, *plain[0], *prompt, suf, *plain[1], mid]
        same = (
            await c.post("/completion", json={"prompt": raw, "n_predict": 4, "temperature": 0.0, "return_tokens": True})
        ).json()
        assert same["tokens"] == out["tokens"] and same["content"] == out["content"]

        for bad, status, message in [
            ({"input_suffix": "x"}, 400, '"input_prefix" is required'),
            ({"input_prefix": "x"}, 400, '"input_suffix" is required'),
            ({**body, "prompt": 3}, 400, '"prompt" must be a string'),
            ({**body, "input_extra": "x"}, 400, '"input_extra" must be an array'),
            ({**body, "input_extra": [{"filename": "a"}]}, 400, 'must contain a "text" field'),
            ({**body, "input_extra": [{"text": "a", "filename": 1}]}, 400, '"filename" field must be a string'),
        ]:
            r = await c.post("/infill", json=bad)
            assert r.status_code == status and message in r.json()["error"]["message"], (bad, r.text)


@pytest.mark.anyio
async def test_infill_prompt_layout() -> None:
    info = ModelInfo("m", "", 64, 100, 64, "", None, "<s>", "</s>", fim=(90, 91, 92, 93, 94), bos_id=1, n_batch=16)

    async def tok(text: str) -> list[int]:
        return [ord(ch) % 80 + 5 for ch in text]

    extra = [{"filename": "a.py", "text": "xy"}]
    got = await infill_tokens(info, tok, "p" * 20, "s" * 9, extra, [7], n_predict=4)
    # prefix cut to 3/4 of the batch (12), suffix to 1/4 minus 2 and the prompt (1), the extra chunks before
    repo = [93, *await tok("myproject\n")]
    chunk = [94, *await tok("a.py\n"), *await tok("xy")]
    current = [94, *await tok("filename\n")]
    extras = [*repo, *chunk, *current]
    n_extra = min(max(0, 64 - 16 - 8), len(extras))
    want = [*extras[len(extras) - n_extra :], 90, *await tok("p" * 12), 7, 91, *await tok("s" * 1), 92]
    assert got == want
    no_rep = ModelInfo("m", "", 64, 100, 64, "", None, "", "", fim=(90, 91, 92, -1, -1), bos_id=1, add_bos=True)
    got = await infill_tokens(no_rep, tok, "ab", "cd", [], [], n_predict=-1)
    assert got == [1, 90, *await tok("ab"), 91, *await tok("cd"), 92]


@pytest.mark.anyio
async def test_a_model_without_fim_tokens_is_refused(tiny_models: dict[str, Path]) -> None:
    async with served(tiny_models["llama"]) as (_rt, c):
        r = await c.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
        assert r.status_code == 501
        err = r.json()["error"]
        assert err["type"] == "not_supported_error"
        assert err["message"] == (
            "Infill is not supported by this model: prefix token is missing. suffix token is missing. "
            "middle token is missing. "
        )
