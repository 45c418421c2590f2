"""Parity oracle: a turnstile Slot answers interleaved conversations exactly as llama-server `-np 1` does.

Four conversations, each with its own persona, take three turns each in the order A1 B1 C1 D1 A2 B2 …
on SmolLM2-135M, greedy, through llama-server (one slot, `--cache-ram`) and through a turnstile `Slot`
with the same context settings (n_ctx, n_batch 2048, n_ubatch 512, flash attention, threads) and the
same RAM cache limit. Each side builds every conversation's history from its own replies. Every turn
must have the same prompt (text and tokens), the same reply text and finish reason, and the same token
accounting: cache_n == cached_tokens, prompt_n == prefilled_tokens, predicted_n == generated tokens.

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (built from the llama.cpp that
llama-cpp-python vendors, so both sides run the same kernels: `make oracle`); skipped without one, failed
without one in CI (tests/conftest.py, tests/support/oracle.py). TURNSTILE_TEST_GPU_LAYERS=N offloads N
layers on both sides (`-ngl N`; `python -m benchmarks gpu-check` sets 99); default 0.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.backend.protocol import SlotRequest
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.slot.executor import Slot
from sessions import Sampling
from tests.support import workloads as _workload
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary

_BINARY = llama_server_binary()

pytestmark = [pytest.mark.oracle, pytest.mark.slow]  # the oracle gate is in tests/conftest.py

N_CTX = 4096
N_BATCH = 2048
N_UBATCH = 512
THREADS = 2
MAX_TOKENS = 48
SEED = 0
GPU_LAYERS = int(os.environ.get("TURNSTILE_TEST_GPU_LAYERS", "0"))
GREEDY = Sampling(temperature=0.0, seed=SEED)

# six personas with five turns each (shared with the benchmarks); the test plays the first 4 x 3
PERSONAS = _workload.PERSONAS


@dataclass(frozen=True)
class Turn:
    """One turn as one side played it."""

    conv: int
    turn: int
    prompt_text: str
    prompt_ids: tuple[int, ...]
    text: str
    finish: str
    prompt_tokens: int
    cache_n: int
    prompt_n: int
    generated: int


def label(conv: int, turn: int) -> str:
    return f"{chr(ord('A') + conv)}{turn + 1}"


def schedule(n_conv: int, n_turn: int) -> list[tuple[int, int]]:
    """Round robin: A1 B1 C1 D1 A2 B2 …"""
    return [(c, t) for t in range(n_turn) for c in range(n_conv)]


def history(conv: int, turn: int, replies: dict[tuple[int, int], str]) -> list[dict[str, str]]:
    """The messages of conversation `conv` at `turn`: its system prompt, its earlier turns, the new user message."""
    system, users = PERSONAS[conv]
    msgs = [{"role": "system", "content": system}]
    for t in range(turn):
        msgs += [{"role": "user", "content": users[t]}, {"role": "assistant", "content": replies[conv, t]}]
    msgs.append({"role": "user", "content": users[turn]})
    return msgs


def play_server(binary: str, model: Path, n_conv: int, n_turn: int, cache_ram_mib: int) -> list[Turn]:
    out: list[Turn] = []
    replies: dict[tuple[int, int], str] = {}
    with LlamaServer(
        binary,
        model,
        n_ctx=N_CTX,
        threads=THREADS,
        cache_ram_mib=cache_ram_mib,
        n_batch=N_BATCH,
        n_ubatch=N_UBATCH,
        seed=SEED,
        extra_args=("-ngl", str(GPU_LAYERS)),
    ) as srv:
        for c, t in schedule(n_conv, n_turn):
            msgs = history(c, t, replies)
            text = srv.apply_template(msgs)  # neither of these touches the slot
            ids = srv.tokenize(text, add_special=True, parse_special=True)
            r = srv.chat(msgs, max_tokens=MAX_TOKENS, temperature=0.0, seed=SEED)
            replies[c, t] = r.text
            out.append(
                Turn(
                    c,
                    t,
                    text,
                    tuple(ids),
                    r.text,
                    r.finish_reason,
                    r.prompt_tokens,
                    r.cache_n,
                    r.prompt_n,
                    r.predicted_n,
                )
            )
    return out


def play_turnstile(model: Path, n_conv: int, n_turn: int, cache_ram_mib: int) -> list[Turn]:
    out: list[Turn] = []
    replies: dict[tuple[int, int], str] = {}
    with Engine(
        model,
        EngineConfig(
            n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_UBATCH, n_threads=THREADS, flash_attn=True, n_gpu_layers=GPU_LAYERS
        ),
    ) as eng:
        slot = Slot(eng, cache_ram_bytes=cache_ram_mib << 20, cache_rules="llama-server")
        for c, t in schedule(n_conv, n_turn):
            msgs = history(c, t, replies)
            r = eng.render(msgs)
            res = slot.run(
                SlotRequest(
                    prompt=r.tokens, sampling=GREEDY.with_overrides(max_tokens=MAX_TOKENS), user_starts=r.user_starts
                )
            )
            replies[c, t] = res.text
            out.append(
                Turn(
                    c,
                    t,
                    r.text,
                    tuple(r.tokens),
                    res.text,
                    res.finish_reason,
                    res.prompt_tokens,
                    res.cached_tokens,
                    res.prefilled_tokens,
                    res.generated_tokens,
                )
            )
    return out


def _short(s: str, n: int = 60) -> str:
    return repr(s if len(s) <= n else s[: n - 1] + "…")


def _first_diff(a: Sequence[object], b: Sequence[object]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def compare(srv: list[Turn], ts: list[Turn]) -> tuple[int, str]:
    """(turns that differ, a per-turn table: server / turnstile for every field, `*` where they differ)."""
    rows = [
        f"{'turn':<5}{'tmpl':>5}{'ids':>5}{'prompt':>11}{'cache_n':>11}{'prompt_n':>11}{'gen':>9}{'finish':>15}  text"
    ]
    bad = 0
    for s, t in zip(srv, ts, strict=True):
        fields: list[tuple[str, object, object, int]] = [
            ("prompt", s.prompt_tokens, t.prompt_tokens, 11),
            ("cache_n", s.cache_n, t.cache_n, 11),
            ("prompt_n", s.prompt_n, t.prompt_n, 11),
            ("gen", s.generated, t.generated, 9),
            ("finish", s.finish, t.finish, 15),
        ]
        same_tmpl, same_ids, same_text = s.prompt_text == t.prompt_text, s.prompt_ids == t.prompt_ids, s.text == t.text
        ok = same_tmpl and same_ids and same_text and all(a == b for _, a, b, _ in fields)
        bad += not ok
        row = f"{label(s.conv, s.turn):<5}{'=' if same_tmpl else '*':>5}{'=' if same_ids else '*':>5}"
        for _, a, b, w in fields:
            row += f"{f'{a}/{b}' + ('' if a == b else '*'):>{w}}"
        row += "  " + ("=" if same_text else f"* srv={_short(s.text)}\n{'':<76}ts ={_short(t.text)}")
        rows.append(row)
        if not same_tmpl:
            k = _first_diff(s.prompt_text, t.prompt_text)
            lo, hi = max(0, k - 20), k + 40
            rows.append(f"      rendered prompts differ at char {k}: srv={_short(s.prompt_text[lo:hi])}")
            rows.append(f"{'':<36}ts ={_short(t.prompt_text[lo:hi])}")
        elif not same_ids:
            k = _first_diff(s.prompt_ids, t.prompt_ids)
            rows.append(
                f"      first differing prompt token at {k}: srv={list(s.prompt_ids[k : k + 6])} "
                f"ts={list(t.prompt_ids[k : k + 6])}"
            )
    return bad, "\n".join(rows)


@pytest.fixture(scope="module")
def binary() -> str:
    return _BINARY


# 8192 MiB: llama-server's default (nothing is evicted). 4 MiB: SmolLM2 keeps 22.5 KiB of K and V per token,
# so the cache holds one or two conversations' states: saves evict older entries, a state over the limit is
# not cached at all, and most turns recompute their history (different prefill start, different answers).
@pytest.mark.parametrize("cache_ram_mib", [8192, 4], ids=["cache-8192MiB", "cache-4MiB"])
def test_interleaved_conversations_match_llama_server(binary: str, smollm2_path: Path, cache_ram_mib: int) -> None:
    n_conv, n_turn = 4, 3
    srv = play_server(binary, smollm2_path, n_conv, n_turn, cache_ram_mib)
    ts = play_turnstile(smollm2_path, n_conv, n_turn, cache_ram_mib)
    bad, table = compare(srv, ts)
    print(f"parity, --cache-ram {cache_ram_mib} MiB: {len(srv) - bad}/{len(srv)} turns equal (server/turnstile)")
    print(table)  # shown with -s, or in the captured output of a failure
    if bad:
        pytest.fail(f"{bad} of {len(srv)} turns differ from llama-server (server/turnstile):\n{table}", pytrace=False)


def test_penalties_and_stop_strings_match_llama_server(binary: str, smollm2_path: Path) -> None:
    """llama-server feeds the prompt to the sampler before generating; penalties must see it too."""
    sampling = {"temperature": 0.0, "repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3}
    chats = [
        [{"role": "system", "content": "You are a poet."}, {"role": "user", "content": "The sea, the sea, the sea."}],
        [{"role": "system", "content": "You are a historian."}, {"role": "user", "content": "List Roman emperors."}],
    ]
    config = EngineConfig(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_UBATCH, n_threads=THREADS, n_gpu_layers=GPU_LAYERS)
    eng = Engine(smollm2_path, config)
    try:
        slot = Slot(eng, cache_ram_bytes=8192 << 20, cache_rules="llama-server")
        ngl = ("-ngl", str(GPU_LAYERS))
        with LlamaServer(binary, smollm2_path, n_ctx=N_CTX, threads=THREADS, cache_ram_mib=8192, extra_args=ngl) as srv:
            for msgs in chats:
                for stop in ((), (".",)):
                    want = srv.chat(msgs, max_tokens=MAX_TOKENS, seed=SEED, stop=list(stop), **sampling)
                    r = eng.render(msgs)
                    got = slot.run(
                        SlotRequest(
                            prompt=r.tokens,
                            sampling=Sampling(seed=SEED, max_tokens=MAX_TOKENS, stop=stop, **sampling),  # type: ignore[arg-type]
                            user_starts=r.user_starts,
                        )
                    )
                    assert (got.text, got.cached_tokens) == (want.text, want.cache_n)
    finally:
        eng.close()
