"""Decode preemption on real llama.cpp (tiny transformer, recurrent, hybrid and sliding-window models): a
generation paused after a token, its state swapped out by another conversation and found again, goes on with
the tokens, text and cached/prefilled counts of the same request run without a pause (greedy, and sampled
with a seed: the paused generation keeps its sampler)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from runtime.backend.protocol import DecodePaused, SlotRequest, SlotResult
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.log import capture_logs
from runtime.slot.decode import Generation
from runtime.slot.executor import Slot
from sessions import Sampling

CFG = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=32, n_batch=64)
GREEDY = Sampling(temperature=0.0, max_tokens=12, ignore_eos=True)
SAMPLED = Sampling(temperature=0.9, seed=7, max_tokens=12, ignore_eos=True, repeat_penalty=1.2)
ARCHS = ["llama", "mamba", "jamba", "gemma3"]


def request(eng: Engine, user: str, sampling: Sampling = GREEDY, **kw: object) -> SlotRequest:
    r = eng.render([{"role": "system", "content": "You tell stories."}, {"role": "user", "content": user}])
    return SlotRequest(prompt=r.tokens, sampling=sampling, user_starts=r.user_starts, **kw)  # type: ignore[arg-type]


def pause_at(*ns: int) -> Callable[[int], bool]:
    """Say stop after the `ns`-th generated tokens."""
    return lambda generated: generated in ns


def run_paused(
    slot: Slot, eng: Engine, sampling: Sampling, at: tuple[int, ...]
) -> tuple[list[DecodePaused], SlotResult]:
    """Run the story with pauses at `at`, another conversation in each pause, and the story resumed each time."""
    pieces: list[str] = []
    pauses: list[DecodePaused] = []
    carry = None
    while True:
        req = request(
            eng, "Tell me a story about the sea.", sampling, on_piece=pieces.append, pause_decode=pause_at(*at)
        )
        req.carry, req.resumed = carry, bool(pauses)
        try:
            out = slot.run(req)
        except DecodePaused as p:
            pauses.append(p)
            carry = p.carry
            assert slot.tokens == p.carry.held and len(slot.tokens) == p.done  # a valid state: prompt + tokens
            slot.run(request(eng, "Write about the moon and the stars."))  # swaps the paused state out
            continue
        assert "".join(pieces) == out.text  # the stream saw every piece once, in order
        return pauses, out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_paused_and_resumed_generation_equals_unpaused(
    arch: str, sampling: Sampling, engines: Callable[[str], Engine]
) -> None:
    eng = engines(arch)
    whole = Slot(eng, cache_ram_bytes=0).run(request(eng, "Tell me a story about the sea.", sampling))
    assert len(whole.tokens) == 12

    eng2 = engines(arch)
    slot = Slot(eng2, cache_ram_bytes=0)
    with capture_logs() as logs:
        pauses, resumed = run_paused(slot, eng2, sampling, (1, 5))
    assert [p.generated for p in pauses] == [1, 5]
    assert resumed.tokens == whole.tokens and resumed.text == whole.text and resumed.finish_reason == "length"
    assert pauses[0].cached == whole.cached_tokens and pauses[0].prefilled == whole.prefilled_tokens
    assert resumed.cached_tokens == pauses[1].done and resumed.prefilled_tokens == 0  # the whole state found
    assert resumed.cache_source == "ram"
    assert [e["generated"] for e in logs if e["event"] == "decode.paused"] == [1, 5]
    st = slot.stats()
    assert st.requests == 1 + len(pauses) and st.generated_tokens == 12 + len(pauses) * 12


def test_a_paused_generation_with_speculation_equals_unpaused(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    whole = Slot(eng, cache_ram_bytes=0, speculative="ngram").run(request(eng, "Tell me a story about the sea."))
    slot = Slot(engines("llama"), cache_ram_bytes=0, speculative="ngram")
    _, resumed = run_paused(slot, slot.engine, GREEDY, (2, 3, 7))
    assert resumed.tokens == whole.tokens and resumed.text == whole.text


@pytest.mark.parametrize("arch", ["llama", "jamba"])
def test_a_paused_generation_whose_state_was_evicted_is_recomputed(arch: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    whole = Slot(eng, cache_ram_bytes=0).run(request(eng, "Tell me a story about the sea."))
    slot = Slot(engines(arch), cache_ram_bytes=None)  # no RAM tier: the paused state is gone once another turn runs
    _, resumed = run_paused(slot, slot.engine, GREEDY, (4,))
    assert len(resumed.tokens) == len(whole.tokens) and resumed.finish_reason == "length"  # goes on, only slower
    assert resumed.tokens[:4] == whole.tokens[:4] and resumed.prefilled_tokens > 0


def test_a_paused_generation_dropped_frees_its_sampler(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    slot = Slot(eng, cache_ram_bytes=0)
    with pytest.raises(DecodePaused) as info:
        slot.run(request(eng, "Tell me a story about the sea.", pause_decode=pause_at(3)))
    gen = info.value.carry
    assert isinstance(gen, Generation) and gen.paused and gen.sampler is not None
    assert eng.pos_max() + 1 == len(slot.tokens) == info.value.done  # memory equals the slot's tokens
    info.value.close()  # the request was cancelled while paused
    assert gen.sampler is None
    fresh = slot.run(request(eng, "Write about the moon and the stars."))
    assert fresh.finish_reason == "length" and slot.cache.stats().ram_entries == 1  # the partial state: evictable
