"""turnstile's minimum shared prefix (`CacheRuleSet.min_shared_prefix`, 32): a state the prompt does not continue
whole (another conversation's) is reused only for at least that many tokens; llama-server's rules reuse any length.

The rule without a model (`usable`, the tiered plan's RAM and disk candidates); then on real llama.cpp: the tiny
llama model (the slot's own state, a RAM entry, a long shared system prompt), the tiny Jamba model (a checkpoint
rollback), and SmolLM2 with the fairness benchmark's conversations, where a reply depended on what the slot held
before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.fairness import LONG_SYSTEM, document, short_turn
from caches.disk.tier import DiskTier
from caches.prompt_cache import PromptCache, lcp
from caches.tiered import TieredCache
from runtime.backend.protocol import SlotRequest, SlotResult
from runtime.cache_rules import LLAMA_SERVER, MIN_SHARED_PREFIX, TURNSTILE
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.slot.executor import Slot
from runtime.slot.lookup import TurnstileLookup, usable
from runtime.slot.shared import AnyState, StateCodec
from runtime.slot.state import Checkpoint, SlotState
from runtime.types import CacheRules
from sessions import Sampling

CFG = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=64, n_batch=256)
GREEDY = Sampling(temperature=0.0).with_overrides(max_tokens=8)
LONG = "You are one of the lighthouse crew's agents; answer briefly and log every lamp change. " * 2


# --- the rule without a model ---------------------------------------------------------------------------


def test_the_rule_is_turnstiles_only() -> None:
    assert (TURNSTILE.min_shared_prefix, LLAMA_SERVER.min_shared_prefix) == (MIN_SHARED_PREFIX, 0) == (32, 0)


def test_usable_keeps_another_states_prefix_only_from_the_minimum() -> None:
    assert usable(7, 200, (), True) == 7  # the rule off: any length
    assert usable(7, 200, (), True, 32) == 0
    assert usable(31, 200, (), True, 32) == 0
    assert usable(32, 200, (), True, 32) == 32
    assert usable(20, 200, (), True, 32) == 0  # a short prompt the state holds whole and goes beyond
    # a state the prompt continues whole (its own previous turn, a paused prefill) is kept at any length
    assert usable(7, 7, (), True, 32) == 7
    cps = [Checkpoint(n_tokens=n, pos_min=0, pos_max=n, data=b"x") for n in (10, 40, 90)]
    assert usable(60, 100, cps, False, 32) == usable(60, 100, cps, False) == 40
    assert (usable(39, 100, cps, False), usable(39, 100, cps, False, 32)) == (10, 0)  # what it keeps counts
    assert usable(20, 20, cps, False, 32) == 20


PROMPT = tuple(range(1000, 1050))  # 50 tokens
FEW = (*PROMPT[:7], *range(1, 14))  # another conversation's state: 7 template tokens of its 20 shared
MANY = (*PROMPT[:32], *range(1, 41))  # 32 shared: a system prompt


def _state(tokens: tuple[int, ...]) -> SlotState:
    return SlotState(bytes(len(tokens)))  # small: any gain pays for its load


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[DiskTier]:
    with DiskTier(tmp_path / "tier", fingerprint="test") as tier:
        yield tier


@pytest.mark.parametrize("least", [0, 32])
def test_a_ram_entry_sharing_a_few_tokens_is_not_loaded(least: int) -> None:
    ram: PromptCache[AnyState] = PromptCache(0, 0)
    cache: TieredCache[AnyState] = TieredCache(ram, None, StateCodec(None), lookup=TurnstileLookup(min_shared=least))
    ram.save(FEW, len(FEW), lambda: _state(FEW))
    plan = cache.plan((), PROMPT, 0)
    if least:
        assert (plan.load, plan.kept) == (None, 0)
    else:
        assert plan.load is not None and (plan.load.tier, plan.load.kept, plan.kept) == ("ram", 7, 7)
    ram.save(MANY, len(MANY), lambda: _state(MANY))
    plan = cache.plan((), PROMPT, 0)
    assert plan.load is not None and plan.load.entry is not None
    assert (plan.load.entry.tokens, plan.load.kept, plan.kept) == (MANY, 32, 32)


@pytest.mark.parametrize("least", [0, 32])
def test_a_disk_entry_sharing_a_few_tokens_is_not_read(least: int, disk: DiskTier) -> None:
    cache = TieredCache(None, disk, StateCodec(None), lookup=TurnstileLookup(min_shared=least))
    assert cache.keep(FEW, len(FEW), _state(FEW)) > 0  # no RAM: it goes to disk
    plan = cache.plan((), PROMPT, 0)
    if least:
        assert (plan.load, plan.kept) == (None, 0)
    else:
        assert plan.load is not None and (plan.load.tier, plan.load.kept) == ("disk", 7)
        assert cache.apply(plan, None).tokens == FEW


def test_the_slots_own_few_tokens_count_as_kept_only_when_continued(disk: DiskTier) -> None:
    # the slot's tokens: what `Slot._use_cache` reports as `slot_kept` decides whether the slot is saved whole
    cache = TieredCache(PromptCache(0, 0), disk, StateCodec(None), lookup=TurnstileLookup(min_shared=32))
    kept = usable(lcp(FEW, PROMPT), len(FEW), (), True, 32)
    plan = cache.plan(FEW, PROMPT, 10**6, slot_kept=kept)
    assert plan.kept == 0 and plan.save is not None and plan.save.tokens == FEW  # all 20 would be lost: saved


# --- the slot on real llama.cpp -------------------------------------------------------------------------


def _request(eng: Engine, system: str, user: str, sampling: Sampling = GREEDY) -> SlotRequest:
    r = eng.render([{"role": "system", "content": system}, {"role": "user", "content": user}])
    return SlotRequest(prompt=r.tokens, sampling=sampling, user_starts=r.user_starts)


def _alone(eng: Engine, req: SlotRequest) -> SlotResult:
    res = Slot(eng, cache_ram_bytes=None).run(req)
    assert res.cached_tokens == 0
    return res


@pytest.mark.parametrize("rules", ["turnstile", "llama-server"])
def test_another_conversations_template_tokens_are_not_reused(
    rules: CacheRules, engines: Callable[[str], Engine]
) -> None:
    eng = engines("llama")
    a = _request(eng, "You are agent A.", "tell me about the sea")
    b = _request(eng, "You are agent B.", "tell me about the moon")
    c = _request(eng, "You are agent C.", "tell me about the stars")
    assert (lcp(a.prompt, b.prompt), lcp(b.prompt, c.prompt), len(b.prompt), len(c.prompt)) == (20, 20, 57, 59)
    alone_b, alone_c = _alone(eng, b), _alone(eng, c)
    slot = Slot(eng, cache_ram_bytes=0, cache_rules=rules)  # RAM without a limit
    slot.run(a)
    held_a = list(slot.tokens)
    res = slot.run(b)  # the slot holds A's state
    assert res.tokens == alone_b.tokens
    turnstile = rules == "turnstile"
    done = (res.cached_tokens, res.prefilled_tokens, res.cache_source)
    assert done == ((0, 57, "none") if turnstile else (20, 37, "slot"))
    # A's own next turn continues its state whole: taken back at any length (from RAM under turnstile's rules)
    a2 = SlotRequest([*held_a, *eng.tokenize(" more", add_special=False)], GREEDY)
    res = slot.run(a2)
    assert (res.cached_tokens, res.prefilled_tokens, res.cache_source, len(held_a)) == (64, 4, "ram", 64)
    # a third conversation: the slot holds A's state, RAM B's, each sharing 20 template tokens with it
    res = slot.run(c)
    assert res.tokens == alone_c.tokens
    done = (res.cached_tokens, res.prefilled_tokens, res.cache_source)
    assert done == ((0, 59, "none") if turnstile else (20, 39, "slot"))
    st = slot.stats()
    assert (st.cached_tokens, st.ram_loads) == ((64, 1) if turnstile else (20 + 64 + 20, 1))


@pytest.mark.parametrize("rules", ["turnstile", "llama-server"])
def test_a_shared_system_prompt_is_reused_under_both_rules(rules: CacheRules, engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    a = _request(eng, LONG, "tell me about the sea")
    b = _request(eng, LONG, "tell me about the moon")
    shared = lcp(a.prompt, b.prompt)
    assert shared >= MIN_SHARED_PREFIX
    slot = Slot(eng, cache_ram_bytes=None, cache_rules=rules)
    slot.run(a)
    res = slot.run(b)
    assert (res.cached_tokens, res.prefilled_tokens) == (shared, len(b.prompt) - shared)
    assert res.tokens == _alone(eng, b).tokens


@pytest.mark.parametrize("rules", ["turnstile", "llama-server"])
@pytest.mark.parametrize("system", ["You are agent A.", LONG])
def test_a_checkpoint_of_another_conversation_is_restored_only_from_the_minimum(
    rules: CacheRules, system: str, engines: Callable[[str], Engine]
) -> None:
    eng = engines("jamba")  # hybrid: a memory that cannot drop a suffix rolls back to a checkpoint
    a = _request(eng, system, "tell me about the sea")
    b = _request(eng, system, "tell me about the moon")
    slot = Slot(eng, cache_ram_bytes=None, cache_rules=rules)
    slot.run(a)
    user = a.user_starts[0]  # A's checkpoint at its user message is the one a rollback to the shared prefix finds
    assert user in [c.n_tokens for c in slot.checkpoints] and user < lcp(a.prompt, b.prompt)
    res = slot.run(b)
    assert res.tokens == _alone(eng, b).tokens
    done = (res.cached_tokens, res.prefilled_tokens, res.cache_source, slot.stats().checkpoint_restores)
    if system == LONG:  # 137 tokens to the user message: restored under both rules
        assert done == (137, 32, "checkpoint", 1)
    elif rules == "turnstile":  # 42 tokens shared, but the checkpoint keeps 25: not restored
        assert (user, lcp(a.prompt, b.prompt), done) == (25, 42, (0, 57, "none", 0))
    else:
        assert done == (25, 32, "checkpoint", 1)


def test_a_reply_no_longer_depends_on_the_conversation_before_it(
    smollm2_path: Path, make_engine: Callable[..., Engine]
) -> None:
    """The fairness benchmark's short conversation 0 after the document's conversation: they share 4 template
    tokens, which the document's prefill evaluated in a 182-token batch. llama-server's rules keep those 4 (on this
    project's machine its greedy reply then differs from the one alone a few tokens in: a near-tie);
    turnstile's recompute them, so the reply is the one computed alone."""
    eng = make_engine(smollm2_path, EngineConfig(n_ctx=2048, n_threads=1, n_batch=512, n_ubatch=512))
    greedy = Sampling(temperature=0.0).with_overrides(max_tokens=16)
    doc = document(180, lambda text: len(eng.tokenize(text)))
    question = f"{doc}\n\nWhich boat brought the most crates?"
    long = _request(eng, LONG_SYSTEM, question, greedy.with_overrides(max_tokens=1))
    short = _request(eng, *short_turn(0), greedy)
    assert (len(long.prompt), len(short.prompt), lcp(long.prompt, short.prompt)) == (182, 47, 4)
    alone = _alone(eng, short)
    counts = {}
    for rules in ("turnstile", "llama-server"):
        slot = Slot(eng, cache_ram_bytes=None, cache_rules=rules)
        slot.run(long)
        res = slot.run(short)
        counts[rules] = (res.cached_tokens, res.prefilled_tokens)
        if rules == "turnstile":
            assert res.tokens == alone.tokens  # (llama-server's rules: a near-tie, not asserted either way)
    assert counts == {"turnstile": (0, 47), "llama-server": (4, 43)}
