"""N-gram speculation in the slot on real llama.cpp: the same tokens as one-token decoding, exact stops,
limits and cancels, the slot's invariant after rejected drafts, grammars, and an unchanged distribution.

A random tiny model never copies, so most tests draft with `OracleDrafter`: it proposes the tokens the
unspeculated run produced, with deliberate mistakes in some drafts (a wrong token part way, drafts that run
past the end), so acceptance, rejection, rollback and finishing inside a draft all happen. One test runs
the real n-gram drafter on SmolLM2 copying a passage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.backend.protocol import GrammarSpec, SlotRequest, SlotResult
from runtime.config import EngineConfig
from runtime.errors import InvalidConfig
from runtime.llama.engine import Engine
from runtime.slot.executor import Slot
from runtime.slot.ngram import Drafter, NgramIndex
from sessions import Sampling

# n_ubatch 1: a drafted batch runs as one-token ubatches, so its logits are bit-identical to one-token
# decoding (with larger ubatches the matrix kernels round differently and a random tiny model's near-ties
# can flip; SmolLM2 below runs with the default ubatch)
CFG = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=1, n_batch=256)
GREEDY = Sampling(temperature=0.0)


class OracleDrafter(Drafter):
    """Drafts `k` tokens of a known continuation; every `wrong_every`-th draft has a wrong token at offset 2."""

    def __init__(self, slot: Slot, n_prompt: int, reference: list[int], k: int = 5, wrong_every: int = 3) -> None:
        super().__init__(NgramIndex())
        self.slot, self.n_prompt, self.reference = slot, n_prompt, reference
        self.k, self.wrong_every, self.calls = k, wrong_every, 0

    def draft(self, last: int, room: int) -> list[int]:
        j = len(self.slot.tokens) - self.n_prompt  # `last` is reference[j]: generated, not yet in memory
        assert self.reference[j] == last, "the run left the reference: speculation changed the output"
        self.calls += 1
        draft = self.reference[j + 1 : j + 1 + min(self.k, room)]
        if self.wrong_every and self.calls % self.wrong_every == 0 and len(draft) > 2:
            draft[2] = (draft[2] + 1) % self.slot.engine.n_vocab
        if len(draft) < min(self.k, room):  # past the reference's end: guesses
            draft += [7] * (min(self.k, room) - len(draft))
        return draft


class OracleSlot(Slot):
    """A slot whose drafter is made by the test."""

    make: Callable[[Slot, SlotRequest], Drafter] | None = None

    def _drafter(self, req: SlotRequest) -> Drafter | None:
        return self.make(self, req) if self.make is not None else None


@pytest.fixture
def engine(tiny_llama: Path) -> Iterator[Engine]:
    eng = Engine(tiny_llama, CFG)
    yield eng
    eng.close()


def prompt(eng: Engine, text: str = "tell me about the sea and a red ship") -> list[int]:
    return eng.render([{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]).tokens


def run(slot: Slot, tokens: list[int], sampling: Sampling, **kw: object) -> tuple[SlotResult, list[str]]:
    pieces: list[str] = []
    req = SlotRequest(prompt=tokens, sampling=sampling, on_piece=pieces.append, **kw)  # type: ignore[arg-type]
    return slot.run(req), pieces


def assert_invariant(slot: Slot, tokens: list[int], res: SlotResult) -> None:
    """The slot holds the prompt and every generated token but the last (never evaluated), nothing more."""
    assert slot.tokens == tokens + res.tokens[:-1]
    assert slot.engine.pos_max() + 1 == len(slot.tokens)


def reference(eng: Engine, tokens: list[int], sampling: Sampling, **kw: object) -> tuple[SlotResult, list[str]]:
    slot = Slot(eng)
    res, pieces = run(slot, tokens, sampling, **kw)
    assert_invariant(slot, tokens, res)
    return res, pieces


def oracle_slot(eng: Engine, ref: list[int], **kw: int) -> OracleSlot:
    slot = OracleSlot(eng)
    slot.make = lambda s, req: OracleDrafter(s, len(req.prompt), ref, **kw)
    return slot


@pytest.mark.parametrize(("k", "wrong_every"), [(1, 0), (5, 3), (16, 2)])
def test_greedy_with_drafts_gives_the_tokens_of_one_token_decoding(engine: Engine, k: int, wrong_every: int) -> None:
    tokens = prompt(engine)
    ref, ref_pieces = reference(engine, tokens, GREEDY.with_overrides(max_tokens=48))
    slot = oracle_slot(engine, ref.tokens, k=k, wrong_every=wrong_every)
    res, pieces = run(slot, tokens, GREEDY.with_overrides(max_tokens=48))
    assert res.tokens == ref.tokens
    assert res.text == ref.text
    assert pieces == ref_pieces  # streamed token by token as accepted
    assert res.finish_reason == ref.finish_reason == "length"
    assert res.draft_n_accepted > 0
    if wrong_every:
        assert res.draft_n > res.draft_n_accepted  # some drafts were refused and rolled back
    assert_invariant(slot, tokens, res)
    assert slot.stats().draft_n == res.draft_n
    # the next turn reuses the slot as it would without speculation
    more = [*tokens, *res.tokens[:-1], 5, 6]
    slot.make = None
    again, _ = run(slot, more, GREEDY.with_overrides(max_tokens=4))
    assert again.cached_tokens == len(tokens) + len(res.tokens) - 1


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 13])
def test_max_tokens_is_never_exceeded(engine: Engine, max_tokens: int) -> None:
    tokens = prompt(engine)
    ref, _ = reference(engine, tokens, GREEDY.with_overrides(max_tokens=20))
    slot = oracle_slot(engine, ref.tokens, k=8, wrong_every=0)
    res, _ = run(slot, tokens, GREEDY.with_overrides(max_tokens=max_tokens))
    assert res.tokens == ref.tokens[:max_tokens]
    assert res.finish_reason == "length"
    assert_invariant(slot, tokens, res)


def test_a_stop_string_inside_a_draft_stops_exactly_there(engine: Engine) -> None:
    tokens = prompt(engine)
    ref, _ = reference(engine, tokens, GREEDY.with_overrides(max_tokens=48))
    printable = [i for i in range(8, len(ref.text) - 3) if ref.text[i : i + 3].isalnum()]
    stop = ref.text[printable[len(printable) // 2] :][:3]
    want, want_pieces = reference(engine, tokens, GREEDY.with_overrides(max_tokens=48, stop=[stop]))
    assert want.finish_reason == "stop" and stop not in want.text
    slot = oracle_slot(engine, ref.tokens, k=12, wrong_every=0)
    res, pieces = run(slot, tokens, GREEDY.with_overrides(max_tokens=48, stop=[stop]))
    assert (res.text, res.tokens, res.finish_reason) == (want.text, want.tokens, "stop")
    assert pieces == want_pieces
    assert_invariant(slot, tokens, res)


@pytest.mark.parametrize("after", [0, 1, 4, 9])
def test_cancel_stops_at_the_same_token(engine: Engine, after: int) -> None:
    tokens = prompt(engine)
    ref, _ = reference(engine, tokens, GREEDY.with_overrides(max_tokens=40))

    def cancelling(slot: Slot) -> tuple[SlotResult, list[str]]:
        pieces: list[str] = []
        req = SlotRequest(
            prompt=tokens,
            sampling=GREEDY.with_overrides(max_tokens=40),
            on_piece=pieces.append,
            cancel=lambda: len(pieces) > after,
        )
        return slot.run(req), pieces

    want, want_pieces = cancelling(Slot(engine))
    slot = oracle_slot(engine, ref.tokens, k=10, wrong_every=0)
    res, pieces = cancelling(slot)
    assert want.finish_reason == res.finish_reason == "cancelled"
    assert res.tokens == want.tokens
    assert pieces == want_pieces
    assert slot.tokens == [*tokens, *res.tokens]  # a cancelled turn's last token was evaluated
    assert engine.pos_max() + 1 == len(slot.tokens)


def test_grammar_with_drafts_it_refuses(engine: Engine) -> None:
    tokens = prompt(engine)
    grammar = GrammarSpec(gbnf='root ::= [a-z ]+ "."')
    sampling = GREEDY.with_overrides(max_tokens=30)
    ref, _ = reference(engine, tokens, sampling, grammar=grammar)
    assert ref.text and all(c.islower() or c in " ." for c in ref.text)
    slot = oracle_slot(engine, ref.tokens, k=6, wrong_every=2)  # the wrong tokens are mostly not [a-z ]
    res, _ = run(slot, tokens, sampling, grammar=grammar)
    assert (res.text, res.tokens) == (ref.text, ref.tokens)
    assert 0 < res.draft_n_accepted < res.draft_n
    assert_invariant(slot, tokens, res)


def test_speculation_is_off_where_memory_cannot_drop_a_suffix(tiny_models: dict[str, Path]) -> None:
    for arch in ("mamba", "jamba", "gemma3"):
        with Engine(tiny_models[arch], CFG) as eng:
            slot = Slot(eng, speculative="ngram")
            assert slot._drafter(SlotRequest(prompt=[1, 2, 3])) is None


def test_per_request_switch(engine: Engine) -> None:
    on, off = Slot(engine, speculative="ngram"), Slot(engine)
    assert on._drafter(SlotRequest(prompt=[1])) is not None
    assert on._drafter(SlotRequest(prompt=[1], speculative=False)) is None
    assert off._drafter(SlotRequest(prompt=[1], speculative=True)) is not None


def _chi_square(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]]) -> tuple[float, int]:
    """Two-sample chi-square statistic over the categories either sample has (equal sizes), and its df."""
    cats = set(a) | set(b)
    stat = sum((a[c] - b[c]) ** 2 / (a[c] + b[c]) for c in cats)
    return stat, len(cats) - 1


# chi-square critical values at alpha = 0.001 by degrees of freedom
_CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def test_sampled_tokens_keep_their_distribution(engine: Engine) -> None:
    """Generated tokens 1 and 2 are drafted (their most frequent values) and verified by sampling; the joint
    distribution of tokens 0-2 over 400 seeds must match 400 other seeds decoded one token at a time
    (two-sample chi-square at alpha 0.001 over the <= 8 outcomes top-k 2 allows; total variation < 0.1).
    Accepting a drafted token with any probability other than p(x) moves its frequency and fails this."""
    tokens = prompt(engine, "a story")
    sampling = Sampling(temperature=1.5, top_k=2, top_p=1.0, min_p=0.0, max_tokens=4)
    n = 400
    base = Slot(engine)
    plain = [base.run(SlotRequest(prompt=tokens, sampling=sampling.with_overrides(seed=s))).tokens for s in range(n)]
    mode1 = Counter(t[1] for t in plain).most_common(1)[0][0]
    mode2 = Counter(t[2] for t in plain).most_common(1)[0][0]

    class Fixed(Drafter):
        def draft(self, last: int, room: int) -> list[int]:
            return [mode1, mode2][:room] if len(spec.tokens) == len(tokens) else []

    spec = OracleSlot(engine)
    spec.make = lambda s, req: Fixed(NgramIndex())
    drafted = accepted = 0
    runs: list[list[int]] = []
    for s in range(n, 2 * n):
        res = spec.run(SlotRequest(prompt=tokens, sampling=sampling.with_overrides(seed=s)))
        runs.append(res.tokens)
        drafted += res.draft_n
        accepted += res.draft_n_accepted
    assert drafted == 2 * n
    assert n // 4 < accepted < drafted  # drafts were both accepted and refused often
    a, b = Counter(tuple(t[:3]) for t in plain), Counter(tuple(t[:3]) for t in runs)
    stat, df = _chi_square(a, b)
    assert 3 <= df <= 7
    assert stat < _CRIT[df], (stat, df, a, b)
    tv = sum(abs(a[c] - b[c]) for c in set(a) | set(b)) / (2 * n)
    assert tv < 0.1, tv
    # the same seed gives the same tokens with and without drafts (same logits, same draws)
    same = spec.run(SlotRequest(prompt=tokens, sampling=sampling.with_overrides(seed=3)))
    assert same.tokens == plain[3]


def test_smollm2_copies_with_ngram_drafts(smollm2_path: Path) -> None:
    """The real drafter on a real model copying a passage: the same text as without speculation, and most
    tokens come from accepted drafts."""
    passage = (
        "The old lighthouse stood at the edge of the northern cliffs, where the wind came in hard from the sea "
        "and the grass grew short and grey. For a hundred years its keepers had climbed the spiral stairs."
    )
    with Engine(smollm2_path, EngineConfig(n_ctx=1024, n_threads=2)) as eng:
        tokens = eng.render(
            [{"role": "user", "content": f"Repeat the following passage exactly, word for word:\n\n{passage}"}]
        ).tokens
        sampling = GREEDY.with_overrides(max_tokens=64)
        plain = Slot(eng).run(SlotRequest(prompt=tokens, sampling=sampling))
        slot = Slot(eng, speculative="ngram")
        res = slot.run(SlotRequest(prompt=tokens, sampling=sampling))
        assert res.text == plain.text
        assert res.tokens == plain.tokens
        assert res.draft_n_accepted >= len(res.tokens) // 2, (res.draft_n, res.draft_n_accepted)
        assert slot.ngram.tokens == slot.tokens  # the index follows the slot


PASSAGES = [
    "The old lighthouse stood at the edge of the northern cliffs, where the wind came in hard from the sea "
    "and the grass grew short and grey. For a hundred years its keepers had climbed the spiral stairs.",
    "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n"
    "    return 2 * (width + height)\n",
]


async def _copy_turns(model: Path, sids: list[str], *, speculative: str | None) -> tuple[dict[str, list[str]], Any]:
    """Each session asks for each passage to be repeated, the sessions' turns interleaved round robin."""
    texts: dict[str, list[str]] = {sid: [] for sid in sids}
    async with Runtime.open(model, n_ctx=2048, n_threads=2, cache_ram_mib=256, speculative=speculative) as rt:
        for sid in sids:
            await rt.create_session(sid, system=f"You are {sid}, a careful copyist.", temperature=0.0)
        draft_accepted = 0
        for passage in PASSAGES:
            for sid in sids:
                reply = await rt.chat(sid, f"Repeat exactly:\n\n{passage}", max_tokens=32)
                texts[sid].append(reply.text)
                draft_accepted += reply.usage.draft_n_accepted
        stats = rt.stats().slot
        assert stats.draft_n_accepted == draft_accepted
    return texts, stats


async def test_interleaved_conversations_with_speculation_equal_each_alone(smollm2_path: Path) -> None:
    """Speculation on: a conversation interleaved with another (its state swapped out and back, its n-gram
    index rebuilt from its tokens) gives the text it gives alone."""
    together, stats = await _copy_turns(smollm2_path, ["ada", "bob"], speculative="ngram")
    alone, _ = await _copy_turns(smollm2_path, ["bob"], speculative="ngram")
    assert together["bob"] == alone["bob"]
    assert stats.draft_n_accepted > stats.generated_tokens // 3


async def test_bad_speculative_setting_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig):
        async with Runtime.open(tmp_path / "no-model.gguf", data_dir=tmp_path / "d", speculative="eagle"):  # type: ignore[arg-type]
            pass  # pragma: no cover
    assert not (tmp_path / "d").exists()
    with pytest.raises(InvalidConfig):
        Slot(None, speculative="yes")  # type: ignore[arg-type]
