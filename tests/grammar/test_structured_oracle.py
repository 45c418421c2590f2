"""Structured output against llama-server: the same prompts through its /v1/chat/completions with
`response_format` (JSON schemas) and a raw `grammar`, and through `Runtime.complete`; greedy on SmolLM2.
Every reply's text must be identical (`reply.text` is llama-server's `message.content`: the JSON value,
without the ```json fence SmolLM2 likes to open). Runs only when TURNSTILE_LLAMA_SERVER names a binary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Runtime
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.workloads import STRUCTURED_PROMPTS

_BINARY = llama_server_binary()

pytestmark = [pytest.mark.oracle, pytest.mark.slow]  # the oracle gate is in tests/conftest.py

N_CTX, THREADS, MAX_TOKENS, SEED = 4096, 2, 96, 0

SCHEMAS = STRUCTURED_PROMPTS

GRAMMAR = 'root ::= "The answer is " ("yes" | "no") "."'


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": prompt}]


async def test_structured_output_and_grammar_match_llama_server(smollm2_path: Path) -> None:
    with LlamaServer(_BINARY, smollm2_path, n_ctx=N_CTX, threads=THREADS, cache_ram_mib=8192, seed=SEED) as srv:
        want = [
            srv.chat(
                messages(p),
                max_tokens=MAX_TOKENS,
                seed=SEED,
                response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            ).text
            for p, schema in SCHEMAS
        ]
        want.append(srv.chat(messages("Is water wet?"), max_tokens=MAX_TOKENS, seed=SEED, grammar=GRAMMAR).text)
        want.append(
            srv.chat(
                messages("Give me any JSON object about cats."),
                max_tokens=MAX_TOKENS,
                seed=SEED,
                response_format={"type": "json_object"},
            ).text
        )
    got: list[str] = []
    async with Runtime.open(smollm2_path, n_ctx=N_CTX, n_threads=THREADS, cache_rules="llama-server") as rt:
        for p, schema in SCHEMAS:
            r = await rt.complete(
                messages(p), response_format=schema, max_tokens=MAX_TOKENS, temperature=0.0, seed=SEED
            )
            got.append(r.text)
            if r.finish_reason != "length":
                assert r.parsed is not None
        r = await rt.complete(
            messages("Is water wet?"), grammar=GRAMMAR, max_tokens=MAX_TOKENS, temperature=0.0, seed=SEED
        )
        got.append(r.text)
        r = await rt.complete(
            messages("Give me any JSON object about cats."),
            response_format="json",
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            seed=SEED,
        )
        got.append(r.text)
    assert all(w.startswith("{") for w in want[:5]) and want[5] in ("The answer is yes.", "The answer is no.")
    assert got == want
