"""Token probabilities, logit bias and llama-server's sampler fields on SmolLM2: turnstile's answers equal
llama-server's for the same requests. `n_probs` / `post_sampling_probs` on /completion, `logprobs` on
/v1/completions, `logprobs` / `top_logprobs` on chat completions, streamed and not: token ids and texts
exactly, probabilities to 2e-3 (two builds of llama.cpp); `logit_bias` (a biased greedy run, a ban); seeded
runs through the other samplers (typical, Mirostat 1 and 2, DRY, XTC, dynamic temperature, top-n-sigma, a
changed order); and `return_progress` / `timings_per_token` reports.

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (the oracle gate in tests/conftest.py).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.process import ServeProcess

pytestmark = [pytest.mark.oracle]

N_CTX, THREADS = 2048, 1
# the two builds of llama.cpp (llama-server's and llama-cpp-python's) compute the same logits to ~1e-4, not
# bit for bit: token ids and texts are compared exactly, probabilities to this
TOL = 2e-3
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name a colour."}]

# (path, body): every request's reply is compared (a stream as its events' payloads)
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 3}),
    ("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 3, "post_sampling_probs": True}),
    (
        "/completion",
        {"prompt": PROMPT, "n_predict": 5, "temperature": 0.8, "seed": 7, "n_probs": 4, "post_sampling_probs": True},
    ),
    ("/completion", {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0, "n_probs": 2, "stop": ["."]}),
    ("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 2, "stream": True}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 2, "stream": True}),
    (
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3},
    ),
    (
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2, "stream": True},
    ),
    # logit bias: OpenAI's map, llama-server's pairs with a text and a ban
    ("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "logit_bias": {"7042": -100}}),
    ("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "logit_bias": [[" Paris", False]]}),
    ("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "logit_bias": [[" the", 8.5]]}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0, "logit_bias": {"2342": 20}}),
    # seeded samplers
    *(
        ("/completion", {"prompt": PROMPT, "n_predict": 12, "seed": 42, "temperature": 0.9, **extra})
        for extra in (
            {},
            {"typical_p": 0.5},
            {"mirostat": 1, "mirostat_tau": 4.0},
            {"mirostat": 2, "mirostat_eta": 0.2},
            {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_penalty_last_n": 64},
            {"xtc_probability": 0.9, "xtc_threshold": 0.05},
            {"dynatemp_range": 0.5, "dynatemp_exponent": 1.5},
            {"top_n_sigma": 1.0},
            {"top_k": 0, "min_keep": 3, "top_p": 0.3},
            {"samplers": ["min_p", "temperature", "top_k"], "min_p": 0.1},
            {"samplers": "kt"},
        )
    ),
]


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            raw = r.read().decode()
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.read().decode()}
    if body.get("stream"):
        return [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e.startswith("data: {")]
    return json.loads(raw)


def _probs_of(path: str, body: Any) -> Any:
    """What is compared: the text, the tokens and their probabilities (a stream's joined)."""
    events = body if isinstance(body, list) else [body]
    text, probs = "", []
    for e in events:
        if "status" in e:
            return e
        if path == "/completion":
            text += e.get("content", "")
            probs += e.get("completion_probabilities", [])
        else:
            for c in e.get("choices", []):
                text += c.get("text") or (c.get("message") or c.get("delta") or {}).get("content") or ""
                probs += (c.get("logprobs") or {}).get("content") or []
    return text, probs


def _same_probs(got: list[dict[str, Any]], want: list[dict[str, Any]], where: str) -> None:
    assert len(got) == len(want), f"{where}: {len(got)} tokens with probabilities, llama-server {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g["id"], g["token"], g["bytes"]) == (w["id"], w["token"], w["bytes"]), f"{where} token {i}"
        key = "prob" if "prob" in w else "logprob"
        assert math.isclose(g[key], w[key], abs_tol=TOL), f"{where} token {i}: {g[key]} != {w[key]}"
        tops = "top_probs" if key == "prob" else "top_logprobs"
        assert [c["id"] for c in g[tops]] == [c["id"] for c in w[tops]], f"{where} token {i}: top ids"
        for gc, wc in zip(g[tops], w[tops], strict=True):
            assert (gc["token"], gc["bytes"]) == (wc["token"], wc["bytes"])
            assert math.isclose(gc[key], wc[key], abs_tol=TOL), f"{where} token {i}: {gc} != {wc}"


PROGRESS = {
    "prompt": "This is a test. " * 12,
    "n_predict": 4,
    "temperature": 0,
    "stream": True,
    "return_progress": True,
    "timings_per_token": True,
}


def _progress(url: str) -> Any:
    """A streamed /completion's prompt-progress reports, which events carry timings, and their keys."""
    events = _post(url + "/completion", PROGRESS)
    reports = [
        (e["prompt_progress"]["total"], e["prompt_progress"]["cache"], e["prompt_progress"]["processed"])
        for e in events
        if "prompt_progress" in e
    ]
    timed = ["timings" in e for e in events]
    keys = set().union(*(e["timings"] for e in events if "timings" in e))
    first = next(e["timings"] for e in events if "prompt_progress" in e)
    return reports, timed, keys, (first["prompt_n"], first["predicted_n"])


def _play(url: str) -> list[Any]:
    return [*(_probs_of(path, _post(url + path, body)) for path, body in REQUESTS), _progress(url)]


def test_probabilities_bias_and_samplers_match_llama_server(smollm2_path: Path) -> None:
    with LlamaServer(llama_server_binary(), smollm2_path, n_ctx=N_CTX, threads=THREADS, cache_ram_mib=0) as srv:
        want = _play(srv.url)
    args = ["--model", smollm2_path, "--ctx", N_CTX, "--threads", THREADS, "--cache-ram", 0]
    with ServeProcess(*map(str, args)) as ts:
        got = _play(ts.url)
    (w_reports, w_timed, w_keys, w_first), (g_reports, g_timed, g_keys, g_first) = want.pop(), got.pop()
    assert g_reports == w_reports and len(w_reports) >= 2  # the cached tokens, then each n_batch chunk
    assert g_timed == w_timed and w_keys <= g_keys and g_first == w_first == (0, 0)
    for (path, body), w, g in zip(REQUESTS, want, got, strict=True):
        where = f"{path} {json.dumps(body)}"
        assert "status" not in w, f"llama-server refused {where}: {w}"
        assert "status" not in g, f"turnstile refused {where}: {g}"
        assert g[0] == w[0], f"{where}: text {g[0]!r} != llama-server's {w[0]!r}"
        _same_probs(g[1], w[1], where)
    assert all(w[1] for w, (_, b) in zip(want, REQUESTS, strict=True) if "n_probs" in b or "logprobs" in b)
    assert "Paris" not in want[10][0]  # the ban held
