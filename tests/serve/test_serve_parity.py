"""Parity oracle over HTTP: the interleaved 6 x 5 workload, sent as stateless OpenAI requests that resend
each conversation's whole history (as clients do), gets the same answers and the same cached-token counts
from `turnstile serve --cache-rules llama-server` as from llama-server `-np 1`, turn by turn.

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (see tests/slot/test_parity_oracle.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from tests.support import workloads
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.process import ServeProcess

_BINARY = llama_server_binary()

pytestmark = [pytest.mark.oracle, pytest.mark.slow]  # the oracle gate is in tests/conftest.py

N_CONV, N_TURN = 6, 5
N_CTX, N_BATCH, N_UBATCH, THREADS, CACHE_RAM_MIB = 4096, 2048, 512, 2, 8192
MAX_TOKENS, SEED = 48, 0


@dataclass(frozen=True)
class Turn:
    label: str
    text: str
    prompt_tokens: int
    cached: int  # usage.prompt_tokens_details.cached_tokens
    cache_n: int  # timings.cache_n
    prompt_n: int
    predicted_n: int


def label(conv: int, turn: int) -> str:
    return f"{chr(ord('A') + conv)}{turn + 1}"


def play_llama_server(model: Path) -> list[Turn]:
    out: list[Turn] = []
    replies: dict[tuple[int, int], str] = {}
    with LlamaServer(
        _BINARY, model, n_ctx=N_CTX, threads=THREADS, cache_ram_mib=CACHE_RAM_MIB, n_batch=N_BATCH, n_ubatch=N_UBATCH
    ) as srv:
        for c, t in workloads.schedule(N_CONV, N_TURN):
            r = srv.chat(workloads.messages(c, t, replies), max_tokens=MAX_TOKENS, temperature=0.0, seed=SEED)
            replies[c, t] = r.text
            out.append(
                Turn(label(c, t), r.text, r.prompt_tokens, r.cached_tokens, r.cache_n, r.prompt_n, r.predicted_n)
            )
    return out


def play_turnstile(model: Path) -> list[Turn]:
    out: list[Turn] = []
    replies: dict[tuple[int, int], str] = {}
    args = ["--model", model, "--ctx", N_CTX, "--threads", THREADS, "--batch", N_BATCH, "--ubatch", N_UBATCH]
    with ServeProcess(*map(str, args), "--cache-ram", str(CACHE_RAM_MIB), "--cache-rules", "llama-server") as srv:
        oai = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        for c, t in workloads.schedule(N_CONV, N_TURN):
            r = oai.chat.completions.create(
                model="m",
                messages=workloads.messages(c, t, replies),  # type: ignore[arg-type]
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                seed=SEED,
            )
            text = r.choices[0].message.content or ""
            replies[c, t] = text
            u, timings = r.usage, (r.model_extra or {})["timings"]
            assert u is not None and u.prompt_tokens_details is not None
            cached = u.prompt_tokens_details.cached_tokens or 0
            out.append(
                Turn(
                    label(c, t),
                    text,
                    u.prompt_tokens,
                    cached,
                    timings["cache_n"],
                    timings["prompt_n"],
                    timings["predicted_n"],
                )
            )
    assert srv.returncode == 0
    return out


def test_interleaved_workload_over_http_matches_llama_server(smollm2_path: Path) -> None:
    want = play_llama_server(smollm2_path)
    got = play_turnstile(smollm2_path)
    rows = [f"{'turn':<5}{'prompt':>11}{'cached':>11}{'cache_n':>11}{'prompt_n':>11}{'gen':>9}  text"]
    bad = 0
    for s, t in zip(want, got, strict=True):
        pairs = [
            (s.prompt_tokens, t.prompt_tokens),
            (s.cached, t.cached),
            (s.cache_n, t.cache_n),
            (s.prompt_n, t.prompt_n),
            (s.predicted_n, t.predicted_n),
        ]
        ok = s.text == t.text and all(a == b for a, b in pairs) and t.cached == t.cache_n
        bad += not ok
        cells = "".join(
            f"{f'{a}/{b}' + ('' if a == b else '*'):>{w}}" for (a, b), w in zip(pairs, (11, 11, 11, 11, 9), strict=True)
        )
        rows.append(
            f"{s.label:<5}{cells}  {'=' if s.text == t.text else '* ' + repr(s.text[:30]) + ' / ' + repr(t.text[:30])}"
        )
    table = "\n".join(rows)
    print(f"HTTP parity: {len(want) - bad}/{len(want)} turns equal (llama-server/turnstile)\n{table}")
    assert sum(t.cached for t in got) > 0  # the workload does reuse the cache
    if bad:
        pytest.fail(f"{bad} of {len(want)} turns differ (llama-server/turnstile):\n{table}", pytrace=False)
