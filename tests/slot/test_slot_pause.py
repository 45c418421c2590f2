"""Preemptible prefill on real llama.cpp (tiny transformer, recurrent, hybrid and sliding-window models): a
prefill paused at an n_batch boundary, its state swapped out by another conversation and found again, gives
the greedy tokens and the cached/prefilled counts of the same request run without a pause."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from runtime.backend.protocol import PrefillPaused, SlotRequest, SlotResult
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.log import capture_logs
from runtime.slot.executor import Slot
from sessions import Sampling

CFG = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=32, n_batch=64)
GREEDY = Sampling(temperature=0.0, max_tokens=8)
DOC = " ".join(f"line {i}: the cat and the dog tell me a story about the sea and the ship." for i in range(24))
ARCHS = ["llama", "mamba", "jamba", "gemma3"]


def request(eng: Engine, system: str, user: str, pause: Callable[[int, int], bool] | None = None) -> SlotRequest:
    r = eng.render([{"role": "system", "content": system}, {"role": "user", "content": user}])
    return SlotRequest(prompt=r.tokens, sampling=GREEDY, user_starts=r.user_starts, pause=pause)


def pause_at(n: int) -> Callable[[int, int], bool]:
    """Say stop at the first chunk boundary at or past `n` tokens."""
    return lambda done, total: done >= n


def long_request(eng: Engine, pause: Callable[[int, int], bool] | None = None) -> SlotRequest:
    return request(eng, "You read documents.", f"Summarize this: {DOC}", pause)


def paused_then_resumed(slot: Slot, eng: Engine, at: int) -> tuple[PrefillPaused, SlotResult, SlotResult]:
    """Pause the long request at `at`, run another conversation, resume the long one."""
    with pytest.raises(PrefillPaused) as info:
        slot.run(long_request(eng, pause_at(at)))
    paused = info.value
    assert slot.tokens == list(long_request(eng).prompt[: paused.done])  # a valid prefix of the conversation
    other = slot.run(request(eng, "You are a poet.", "Write about the moon."))
    again = long_request(eng)
    resumed = slot.run(SlotRequest(again.prompt, again.sampling, again.user_starts, resumed=True))
    return paused, other, resumed


@pytest.mark.parametrize("arch", ARCHS)
def test_paused_and_resumed_prefill_equals_unpaused(arch: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    whole = Slot(eng, cache_ram_bytes=0).run(long_request(eng))
    assert whole.cached_tokens == 0 and whole.prefilled_tokens == whole.prompt_tokens > 4 * CFG.n_batch

    eng2 = engines(arch)
    slot = Slot(eng2, cache_ram_bytes=0)  # a RAM tier without a limit
    with capture_logs() as logs:
        paused, other, resumed = paused_then_resumed(slot, eng2, 2 * CFG.n_batch)
    # the boundary is a chunk boundary of the unpaused prefill (checkpoint models also cut chunks at user starts)
    assert paused.done >= 2 * CFG.n_batch and paused.cached == 0 and paused.prefilled == paused.done
    assert other.cached_tokens < 32  # another conversation: the paused state was swapped out, not extended
    assert resumed.tokens == whole.tokens and resumed.text == whole.text
    assert resumed.cached_tokens == paused.done and resumed.cache_source == "ram"  # no token evaluated twice
    assert paused.prefilled + resumed.prefilled_tokens == whole.prefilled_tokens
    assert [e["done"] for e in logs if e["event"] == "prefill.paused"] == [paused.done]
    st = slot.stats()
    assert st.requests == 2 and st.prompt_tokens == whole.prompt_tokens + other.prompt_tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_a_paused_state_that_was_evicted_is_recomputed(arch: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    whole = Slot(eng, cache_ram_bytes=0).run(long_request(eng))
    eng2 = engines(arch)
    slot = Slot(eng2, cache_ram_bytes=None)  # no RAM tier: the paused state is gone once another turn runs
    paused, _, resumed = paused_then_resumed(slot, eng2, CFG.n_batch)
    assert resumed.tokens == whole.tokens  # correct, only slower
    assert resumed.cached_tokens < paused.done and resumed.cache_source != "ram"
    assert paused.prefilled + resumed.prefilled_tokens > whole.prefilled_tokens


def test_cancel_at_a_pause_boundary_leaves_the_slot_consistent(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    slot = Slot(eng, cache_ram_bytes=0)
    with pytest.raises(PrefillPaused) as info:
        slot.run(long_request(eng, pause_at(CFG.n_batch)))
    assert eng.pos_max() + 1 == len(slot.tokens) == info.value.done
    # the request is then cancelled instead of resumed: nothing to undo, the prefix is a state like any other
    fresh = slot.run(request(eng, "You are a poet.", "Write about the moon."))
    assert fresh.finish_reason != "cancelled" and slot.cache.stats().ram_entries == 1
