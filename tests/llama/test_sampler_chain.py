"""llama.cpp's other samplers, the logit bias and token probabilities on SmolLM2, in process: the chain built from
`Sampling` (each field changes the tokens where it should, a seed repeats them), a banned token never comes, the
probabilities are the softmax of the logits (or the chain's candidates after sampling), the greedy fast path
stays on when probabilities are asked and off where the chain must run, and the Runtime hands the probabilities
to `Reply.probs` and to streamed `ProbText` pieces. The same fields against llama-server are in
tests/test_llama_probs_oracle.py."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from runtime import Runtime
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.llama.sampler import greedy
from runtime.reply import ProbText, Reply
from sessions import Sampling, history
from sessions.model import Session

PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"


def run(eng: Engine, sampling: Sampling, n: int = 12, text: str = PROMPT) -> list[int]:
    """`n` tokens sampled with `sampling` after `text` (the chain sees the prompt, as the slot feeds it for the
    penalties and DRY, and each generated token)."""
    prompt = eng.tokenize(text)
    eng.clear()
    eng.decode(prompt, 0)
    out: list[int] = []
    with eng.sampler(sampling) as s:
        for t in prompt:
            s.accept(t)
        for i in range(n):
            tok = s.sample()
            out.append(tok)
            eng.decode([tok], len(prompt) + i)
    return out


@pytest.fixture(scope="module")
def eng(smollm2_path: Path) -> Iterator[Engine]:
    """SmolLM2 on one thread and a small context (the conftest `smollm2` engine takes the default threads)."""
    engine = Engine(smollm2_path, EngineConfig(n_ctx=512, n_threads=1))
    yield engine
    engine.close()


def test_a_banned_token_never_comes_and_a_bias_changes_the_greedy_run(eng: Engine) -> None:
    plain = run(eng, Sampling(temperature=0.0))
    first = plain[0]
    banned = run(eng, Sampling(temperature=0.0, logit_bias=((first, -math.inf),)))
    assert first not in banned and banned != plain
    pushed = eng.tokenize(" purple", add_special=False)[0]
    assert run(eng, Sampling(temperature=0.0, logit_bias=((pushed, 100.0),)), 3) == [pushed] * 3


@pytest.mark.parametrize(
    "fields",
    [
        {"typical_p": 0.5},
        {"mirostat": 1, "mirostat_tau": 3.0},
        {"mirostat": 2, "mirostat_eta": 0.2},
        {"xtc_probability": 1.0, "xtc_threshold": 0.01},
        {"dynatemp_range": 0.7},
        {"top_n_sigma": 0.5},
        {"samplers": ("temperature", "top_k")},
        {"top_k": 0, "top_p": 0.2, "min_keep": 5},
    ],
)
def test_each_sampler_field_is_in_the_chain_and_a_seed_repeats_it(eng: Engine, fields: dict[str, object]) -> None:
    sp = Sampling(temperature=1.5, seed=11, top_k=0, top_p=1.0, min_p=0.0).with_overrides(**fields)
    base = Sampling(temperature=1.5, seed=11, top_k=0, top_p=1.0, min_p=0.0)
    got = run(eng, sp)
    assert got == run(eng, sp)  # seeded: the same tokens again
    if fields != {"samplers": ("temperature", "top_k")}:  # an order of no-op samplers changes nothing
        assert got != run(eng, base), f"{fields} changed nothing"
    assert not greedy(sp.with_overrides(temperature=0.0)) or "samplers" in fields or "min_keep" in fields


def test_dry_breaks_a_repetition(eng: Engine) -> None:
    text = "1 2 3 4 1 2 3 4 1 2 3 4 1 2 3"
    plain = eng.detokenize(run(eng, Sampling(temperature=0.0), 4, text))
    dry = Sampling(temperature=0.0, dry_multiplier=2.0, dry_allowed_length=2, seed=1)
    assert plain.startswith(" 4") and not eng.detokenize(run(eng, dry, 4, text)).startswith(" 4")


def test_probabilities_are_the_softmax_of_the_logits(eng: Engine) -> None:
    prompt = eng.tokenize(PROMPT)
    eng.clear()
    eng.decode(prompt, 0)
    logits = eng.logits().astype(np.float64)
    soft = np.exp(logits - logits.max())
    soft /= soft.sum()
    with eng.sampler(Sampling(temperature=0.0, n_probs=5)) as s:
        assert s._argmax  # asking for the model's probabilities keeps the greedy fast path
        tok = s.sample()
        p, top = s.probs(-1, tok, 5)
    assert tok == int(np.argmax(logits)) == top[0].token
    assert [c.token for c in top] == [int(t) for t in np.argsort(-logits, kind="stable")[:5]]
    assert math.isclose(p, soft[tok], rel_tol=1e-4)
    for c in top:
        assert math.isclose(c.p, soft[c.token], rel_tol=1e-4) and c.piece == eng.token_to_piece(c.token)
    assert all(a.p >= b.p for a, b in itertools.pairwise(top))


def test_post_sampling_probabilities_are_the_chains_candidates(eng: Engine) -> None:
    prompt = eng.tokenize(PROMPT)
    eng.clear()
    eng.decode(prompt, 0)
    with eng.sampler(Sampling(temperature=0.0, n_probs=4, post_sampling_probs=True)) as s:
        assert not s._argmax  # the chain runs, its candidates are read
        tok = s.sample()
        p, top = s.probs(-1, tok, 4)
    assert (p, [c.token for c in top], [c.p for c in top]) == (1.0, [tok], [1.0])  # greedy: one candidate
    with eng.sampler(Sampling(temperature=1.0, top_k=3, seed=5, n_probs=10, post_sampling_probs=True)) as s:
        tok = s.sample()
        p, top = s.probs(-1, tok, 10)
    assert len(top) == 3 and tok in [c.token for c in top]  # top-k kept three, nothing of probability 0
    assert math.isclose(sum(c.p for c in top), 1.0, rel_tol=1e-5)
    assert p == next(c.p for c in top if c.token == tok)


def test_the_greedy_fast_path_needs_a_plain_chain() -> None:
    assert greedy(Sampling(temperature=0.0))
    assert greedy(Sampling(temperature=0.0, samplers=("top_k", "temperature"), n_probs=3))
    for fields in (
        {"logit_bias": ((1, 2.0),)},
        {"mirostat": 2},
        {"typical_p": 0.9},
        {"dry_multiplier": 0.5},
        {"xtc_probability": 0.5},
        {"dynatemp_range": 0.5},
        {"top_n_sigma": 1.0},
        {"repeat_penalty": 1.1},
    ):
        assert not greedy(Sampling(temperature=0.0).with_overrides(**fields)), fields


def test_a_ban_survives_export_and_import() -> None:
    s = Session.new("s", sampling=Sampling(logit_bias=((5, -math.inf), (6, 1.5))))
    doc = history.export(s)
    assert '"logit_bias":[[5,false],[6,1.5]]' in doc.replace(" ", "")
    assert history.import_(doc).sampling == s.sampling
    assert "typical_p" not in doc  # the other samplers at their defaults stay out of the document


@pytest.mark.anyio
async def test_the_runtime_hands_on_the_probabilities(smollm2_path: Path) -> None:
    async with Runtime.open(smollm2_path, n_ctx=512, n_threads=1) as rt:
        prompt = await rt.tokenize("The capital of France is", add_special=True)
        reply = await rt.complete_prompt(prompt, temperature=0.0, max_tokens=5, n_probs=2)
        assert [p.token for p in reply.probs] == list(reply.tokens) and all(len(p.top) == 2 for p in reply.probs)
        assert "".join(p.text for p in reply.probs) == reply.text
        plain = await rt.complete_prompt(prompt, temperature=0.0, max_tokens=5)
        assert plain.probs == () and plain.tokens == reply.tokens
        pieces: list[ProbText] = []
        async for item in rt.complete_prompt_stream(prompt, temperature=0.0, max_tokens=5, n_probs=2):
            if isinstance(item, Reply):
                assert item.probs == reply.probs
            else:
                assert isinstance(item, ProbText)
                pieces.append(item)
        assert [p.probs[0].token for p in pieces] == list(reply.tokens)  # one piece per token
        chat = await rt.complete([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4, n_probs=1)
        assert len(chat.probs) == chat.usage.generated_tokens
