"""llama-server's embedding routes through a second llama.cpp context on the chat model's weights: made on
first use, never disturbing the chat slot (its tokens and the next turn's cached count are the same before
and after), llama-server's shapes and refusals, llama.cpp's normalizations; and the vectors equal
llama-server's on SmolLM2 (oracle, mean and last pooling, within 1e-4)."""

from __future__ import annotations

import json
import math
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import pytest

from runtime import Runtime
from runtime.llama.embedder import normalize
from runtime.serve.http import app as make_app
from runtime.serve.http.llama.options import LlamaOptions
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.process import ServeProcess

PROMPT = [5 + (i * 7) % 50 for i in range(24)]


@asynccontextmanager
async def served(model: Path, pooling: str, on: bool = True) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    async with Runtime.open(model, n_ctx=256, n_threads=1, pooling=pooling) as rt:
        application = make_app(rt, model_name="tiny", llama=LlamaOptions(embeddings=on))
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=300) as c:
            yield rt, c


@pytest.mark.anyio
async def test_embeddings_leave_the_chat_slot_alone(tiny_models: dict[str, Path]) -> None:
    async with served(tiny_models["llama"], "mean") as (rt, c):
        body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0.0, "ignore_eos": True, "return_tokens": True}
        first = (await c.post("/completion", json=body)).json()
        assert rt.backend.embedder.ctx is None  # type: ignore[attr-defined]  # made on first use only

        r = await c.post("/v1/embeddings", json={"input": [PROMPT, PROMPT[:10]], "model": "m"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["object"] == "list" and out["model"] == "m"
        assert out["usage"] == {"prompt_tokens": 34, "total_tokens": 34}
        assert [d["index"] for d in out["data"]] == [0, 1] and {d["object"] for d in out["data"]} == {"embedding"}
        for d in out["data"]:
            assert math.isclose(sum(x * x for x in d["embedding"]), 1.0, rel_tol=1e-4)
        assert out["data"][0]["embedding"] != out["data"][1]["embedding"]

        held = rt.stats().slot.slot_tokens
        assert (await c.post("/v1/embeddings", json={"input": "another"})).status_code == 200
        assert rt.stats().slot.slot_tokens == held
        # the next turn reuses all the slot held: the embeddings did not touch it
        more = (await c.post("/completion", json={**body, "prompt": [*PROMPT, *first["tokens"], 9]})).json()
        assert more["timings"]["cache_n"] == len(PROMPT) + len(first["tokens"])

        # llama-server's own shape, and the same vector for the same input
        r = await c.post("/embedding", json={"content": [PROMPT]})
        assert r.status_code == 200
        native = r.json()
        assert native == [{"index": 0, "embedding": [out["data"][0]["embedding"]]}]
        r = await c.post("/v1/embeddings", json={"input": PROMPT, "embd_normalize": -1})
        raw = r.json()["data"][0]["embedding"]
        assert normalize(np.array(raw, dtype=np.float32), 2) == pytest.approx(out["data"][0]["embedding"], abs=1e-6)

        parts = {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
        r = await c.post("/v1/embeddings", json={"input": ["hello world", parts]})
        assert r.status_code == 200 and r.json()["data"][0]["embedding"] == r.json()["data"][1]["embedding"]

        for bad, message in [
            ({}, '"input" or "content" must be provided'),
            ({"input": ""}, "Input content cannot be empty"),
            ({"input": []}, '"input" must not be empty'),
            ({"input": "x", "encoding_format": "hex"}, "Can be either float or base64"),
        ]:
            r = await c.post("/v1/embeddings", json=bad)
            assert r.status_code == 400 and message in r.json()["error"]["message"], (bad, r.text)
        r = await c.post("/v1/embeddings", json={"input": list(range(5, 300))})
        assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"


@pytest.mark.anyio
async def test_pooling_none_and_embeddings_off(tiny_models: dict[str, Path]) -> None:
    async with served(tiny_models["llama"], "none") as (_rt, c):
        r = await c.post("/embedding", json={"content": PROMPT[:5]})
        assert r.status_code == 200
        assert len(r.json()[0]["embedding"]) == 5  # one vector per token
        r = await c.post("/v1/embeddings", json={"input": PROMPT[:5]})
        assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]
    async with served(tiny_models["llama"], "mean", on=False) as (_rt, c):
        for path in ("/embedding", "/embeddings", "/v1/embeddings"):
            r = await c.post(path, json={"input": "x"})
            assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
            assert "--embeddings" in r.json()["error"]["message"]


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read().decode())


INPUTS = ["I believe the meaning of life is", "This is a test", "Write a joke about AI"]


def _play(url: str) -> tuple[list[list[float]], Any, Any]:
    oai = _post(url + "/v1/embeddings", {"input": INPUTS})
    native = _post(url + "/embedding", {"content": INPUTS[1]})
    return [d["embedding"] for d in oai["data"]], oai["usage"], [sorted(e) for e in native]


@pytest.mark.oracle
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embeddings_match_llama_server(smollm2_path: Path, pooling: str) -> None:
    flags = ["--embedding", "--pooling", pooling]
    with LlamaServer(llama_server_binary(), smollm2_path, n_ctx=512, threads=1, cache_ram_mib=0, extra_args=flags) as s:
        want = _play(s.url)
    args = ["--model", smollm2_path, "--ctx", 512, "--threads", 1, "--cache-ram", 0, *flags]
    with ServeProcess(*map(str, args)) as ts:
        got = _play(ts.url)
    assert got[1] == want[1] and got[2] == want[2]
    for g, w in zip(got[0], want[0], strict=True):
        assert len(g) == len(w) == 576
        assert np.max(np.abs(np.array(g) - np.array(w))) < 1e-4


@pytest.mark.anyio
async def test_rerank_shapes_and_refusals(tiny_models: dict[str, Path]) -> None:
    async with Runtime.open(tiny_models["llama"], n_ctx=256, n_threads=1, pooling="rank") as rt:
        options = LlamaOptions(embeddings=True, reranking=True)
        application = make_app(rt, model_name="tiny", llama=options)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
            docs = ["a cat sat", "the dog ran far", "hello", "a cat sat"]
            r = await c.post("/v1/rerank", json={"query": "cat", "documents": docs, "top_n": 3})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["object"] == "list" and out["model"] == "tiny" and len(out["results"]) == 3
            scores = [x["relevance_score"] for x in out["results"]]
            assert scores == sorted(scores, reverse=True)
            everything = (await c.post("/rerank", json={"query": "cat", "documents": docs})).json()["results"]
            by_index = {x["index"]: x["relevance_score"] for x in everything}
            assert by_index[0] == by_index[3]  # the same document, the same score
            q = len(await rt.tokenize("cat", add_special=False, parse_special=False))
            lengths = [len(await rt.tokenize(d, add_special=False, parse_special=False)) for d in docs]
            assert out["usage"]["prompt_tokens"] == sum(q + n for n in lengths)  # no BOS, EOS or SEP here

            tei = (await c.post("/reranking", json={"query": "cat", "texts": docs, "return_text": True})).json()
            assert [x["index"] for x in tei] == [x["index"] for x in everything]
            assert all(x["text"] == docs[x["index"]] and "score" in x for x in tei)
            for bad, message in [
                ({"documents": docs}, '"query" must be provided'),
                ({"query": 1, "documents": docs}, '"query" must be a string'),
                ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
                ({"query": "q", "documents": [1]}, '"documents" must be a non-empty string array'),
            ]:
                r = await c.post("/v1/reranking", json=bad)
                assert r.status_code == 400 and message in r.json()["error"]["message"], (bad, r.text)
    async with served(tiny_models["llama"], "mean") as (_rt, c):
        r = await c.post("/rerank", json={"query": "q", "documents": ["d"]})
        assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]


RERANK = {"query": "Machine learning is", "documents": ["A machine", "Learning is", "Paris, capitale de la"]}


@pytest.mark.oracle
def test_rerank_matches_llama_server(smollm2_path: Path) -> None:
    flags = ["--reranking"]
    with LlamaServer(llama_server_binary(), smollm2_path, n_ctx=512, threads=1, cache_ram_mib=0, extra_args=flags) as s:
        want = _post(s.url + "/v1/rerank", RERANK)
    args = ["--model", smollm2_path, "--ctx", 512, "--threads", 1, "--cache-ram", 0, *flags]
    with ServeProcess(*map(str, args)) as ts:
        got = _post(ts.url + "/v1/rerank", RERANK)
    assert got["usage"] == want["usage"]
    assert [r["index"] for r in got["results"]] == [r["index"] for r in want["results"]]
    for g, w in zip(got["results"], want["results"], strict=True):
        assert g["relevance_score"] == pytest.approx(w["relevance_score"], abs=1e-4)
