"""llama-server's /completion, /v1/completions, /tokenize and /apply-template on SmolLM2: turnstile's
answers equal llama-server's for the same greedy requests (text, token counts, stop type), plain and
streamed, and a GBNF grammar constrains both alike.

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (the oracle gate in tests/conftest.py).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.process import ServeProcess

pytestmark = [pytest.mark.oracle]

N_CTX, THREADS = 2048, 2
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/completion", {"prompt": "I believe the meaning of life is", "n_predict": 12, "temperature": 0.0}),
    ("/completion", {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0.0, "stop": ["."]}),
    ("/completion", {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0.0, "return_tokens": True}),
    (
        "/completion",
        {"prompt": "Answer yes or no:", "n_predict": 6, "temperature": 0.0, "grammar": 'root ::= "yes" | "no"'},
    ),
    ("/v1/completions", {"prompt": "Hello, my name is", "max_tokens": 10, "temperature": 0.0}),
    ("/tokenize", {"content": "Hello world", "with_pieces": True}),
    ("/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
]
_KEYS = {
    "/completion": ("content", "tokens_predicted", "tokens_evaluated", "stop_type", "stopping_word", "tokens"),
    "/v1/completions": ("choices",),
    "/tokenize": ("tokens",),
    "/apply-template": ("prompt",),
}


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
    if body.get("stream"):
        return [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e.startswith("data: {")]
    return json.loads(raw)


def _view(path: str, body: Any) -> Any:
    if path == "/v1/completions":
        return [(c["text"], c["finish_reason"]) for c in body["choices"]], body["usage"]
    return {k: body[k] for k in _KEYS[path]}


def _play(url: str) -> list[Any]:
    out = [_view(path, _post(url + path, body)) for path, body in REQUESTS]
    stream = _post(
        url + "/completion", {"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "stream": True}
    )
    out.append(("".join(e["content"] for e in stream), stream[-1]["stop"], stream[-1]["tokens_predicted"]))
    return out


def test_completion_routes_match_llama_server(smollm2_path: Path) -> None:
    with LlamaServer(llama_server_binary(), smollm2_path, n_ctx=N_CTX, threads=THREADS, cache_ram_mib=0) as srv:
        want = _play(srv.url)
    args = ["--model", smollm2_path, "--ctx", N_CTX, "--threads", THREADS, "--cache-ram", 0]
    with ServeProcess(*map(str, args)) as ts:
        got = _play(ts.url)
    for (path, _), w, g in zip([*REQUESTS, ("stream", {})], want, got, strict=True):
        assert g == w, f"{path}: turnstile {g!r} != llama-server {w!r}"
    assert want[3]["content"] in ("yes", "no")  # the grammar held
