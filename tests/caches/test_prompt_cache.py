"""llama-server's prompt cache rules (`caches.PromptCache`), with `str` states and no model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from caches.prompt_cache import (
    DEFAULT_LIMIT_BYTES,
    Entry,
    PromptCache,
    PromptCacheStats,
    SavePlan,
    default_limit_bytes,
    lcp,
    pick_better,
    plan_save,
    plan_update,
    update_due,
)
from runtime.log import capture_logs


def toks(*runs: tuple[int, int]) -> list[int]:
    """Concatenate ranges: toks((0, 4), (100, 102)) == [0, 1, 2, 3, 100, 101]."""
    return [t for a, b in runs for t in range(a, b)]


class Calls:
    """A `state()` closure that counts its calls."""

    def __init__(self, value: str) -> None:
        self.value, self.n = value, 0

    def __call__(self) -> str:
        self.n += 1
        return self.value


def never() -> str:
    raise AssertionError("state() must not be called when nothing is stored")


# -- lcp ----------------------------------------------------------------------------------------------------


def test_lcp() -> None:
    assert lcp([], []) == 0
    assert lcp([1, 2, 3], []) == 0
    assert lcp([1, 2, 3], [1, 2, 3]) == 3
    assert lcp([1, 2, 3], [1, 2, 3, 4]) == 3
    assert lcp([1, 2, 3], [1, 9, 3]) == 1
    assert lcp((1, 2, 3), [1, 2, 4]) == 2  # a tuple and a list
    assert lcp(range(5), [0, 1, 2, 7]) == 3
    long = list(range(5000))
    for cut in (0, 255, 256, 257, 300, 1000, 4999):
        other = [*long[:cut], -1, *long[cut + 1 :]]
        assert lcp(long, other) == cut
        assert lcp(tuple(other), long) == cut


# -- when an update is due ----------------------------------------------------------------------------------


def test_update_due_empty_slot() -> None:
    assert update_due([], toks((0, 10))) is True
    assert PromptCache.wants_update([], toks((0, 10))) is True


def test_update_due_similarity_at_or_below_threshold() -> None:
    slot = toks((0, 3))
    assert update_due(slot, toks((0, 1), (100, 109))) is True  # 1/10 == 0.1: not above it
    assert update_due(slot, toks((100, 110))) is True  # nothing shared
    assert update_due(slot, toks((0, 2), (100, 108))) is False  # 2/10 > 0.1, keeps 2/3 of the slot


def test_update_due_exactly_half_kept_is_not_under_half() -> None:
    prompt = toks((0, 4), (100, 106))  # 10 tokens, 4 shared: similarity 0.4
    assert update_due(toks((0, 8)), prompt) is False  # keeps 4/8, exactly half
    assert update_due(toks((0, 9)), prompt) is True  # keeps 4/9, under half
    assert update_due(toks((0, 7)), prompt) is False  # keeps 4/7


def test_update_due_in_single_precision_as_llama_server() -> None:
    # f_keep = (float(13)/22 * 22) / 26 is 0.49999997f in C++: an update, though 13 of 26 is half.
    assert update_due(toks((0, 26)), toks((0, 13), (100, 109))) is True
    assert update_due(toks((0, 14)), toks((0, 7), (100, 116))) is True  # 7/23 * 23 / 14, likewise


def test_update_due_similarity_off_or_empty_prompt() -> None:
    slot = toks((0, 10))
    assert update_due(slot, slot, similarity=0.0) is True  # no similarity search: the slot is taken by LRU
    assert update_due(slot, toks((0, 9)), similarity=0.5) is False
    assert update_due(slot, toks((0, 5), (100, 105)), similarity=0.5) is True  # 0.5 is not above 0.5
    assert update_due(slot, []) is True  # 0/0 is NaN: never "similar"


# -- save ---------------------------------------------------------------------------------------------------


def test_save_skips_an_empty_slot() -> None:
    pc: PromptCache[str] = PromptCache(0, 0)
    assert pc.save([], 10, never) is False
    assert len(pc) == 0
    assert pc.stats().skipped == 1


def test_no_duplicate_saves() -> None:
    pc: PromptCache[str] = PromptCache(0, 0)
    state = Calls("A")
    assert pc.save(toks((0, 10)), 100, state) is True
    assert pc.save(toks((0, 10)), 100, never) is False  # already held whole
    assert pc.save(toks((0, 6)), 60, never) is False  # a prefix of an entry: held whole too
    assert state.n == 1
    assert [(e.tokens, e.nbytes, e.state) for e in pc.entries] == [(tuple(range(10)), 100, "A")]


def test_an_entry_the_slot_holds_whole_is_replaced() -> None:
    pc: PromptCache[str] = PromptCache(0, 0)
    pc.save(toks((0, 4)), 40, Calls("A4"))
    pc.save(toks((100, 103)), 30, Calls("B"))
    pc.save(toks((0, 2)), 20, Calls("A2"))  # a prefix of A4: held whole, skipped
    assert [e.state for e in pc.entries] == ["A4", "B"]
    assert pc.save(toks((0, 8)), 80, Calls("A8")) is True  # holds A4 whole: A4 is dropped
    assert [e.state for e in pc.entries] == ["B", "A8"]
    assert pc.drain_evicted() == []  # a replaced entry is not an eviction
    s = pc.stats()
    assert (s.replaced, s.evictions, s.saves, s.skipped) == (1, 0, 3, 1)


def test_the_oldest_is_evicted_at_the_byte_limit() -> None:
    pc: PromptCache[str] = PromptCache(100, 0)
    pc.save(toks((0, 4)), 40, Calls("A"))
    pc.save(toks((100, 104)), 40, Calls("B"))
    assert pc.save(toks((200, 203)), 30, Calls("C")) is True  # 40 + 40 + 30 > 100: A goes
    assert [e.state for e in pc.entries] == ["B", "C"]
    assert pc.nbytes == 70
    evicted = pc.update()
    assert [(e.tokens, e.nbytes, e.state) for e in evicted] == [((0, 1, 2, 3), 40, "A")]
    assert pc.update() == []
    assert pc.save(toks((300, 302)), 100, Calls("D")) is True  # exactly the limit: everything else goes
    assert [e.state for e in pc.entries] == ["D"]
    assert [e.state for e in pc.drain_evicted()] == ["B", "C"]
    assert pc.drain_evicted() == []
    s = pc.stats()
    assert (s.entries, s.bytes, s.evictions, s.evicted_bytes) == (1, 100, 3, 110)


def test_an_entry_larger_than_the_limit_is_not_cached() -> None:
    pc: PromptCache[str] = PromptCache(100, 0)
    pc.save(toks((0, 4)), 40, Calls("A"))
    with capture_logs() as logs:
        assert pc.save(toks((0, 8)), 101, never) is False
    # Refused before anything changes: A, which the slot holds whole, stays (llama-server's order).
    assert [e.state for e in pc.entries] == ["A"]
    assert [log["event"] for log in logs] == ["prompt_cache.too_large"]
    assert logs[0]["log_level"] == "warning"
    assert pc.update() == []


def test_state_is_not_called_when_nothing_is_stored() -> None:
    pc: PromptCache[str] = PromptCache(100, 0)
    pc.save(toks((0, 10)), 10, Calls("A"))
    assert pc.save([], 10, never) is False
    assert pc.save(toks((0, 5)), 10, never) is False
    assert pc.save(toks((50, 60)), 1000, never) is False
    assert pc.stats().skipped == 3


def test_plan_save_is_pure() -> None:
    entries = [(toks((0, 2)), 20), (toks((100, 104)), 40), (toks((0, 1)), 10)]
    assert plan_save(entries, toks((0, 5)), 50, 100) == SavePlan(True, "stored", (0, 2), 0)
    assert plan_save(entries, toks((0, 5)), 70, 100) == SavePlan(True, "stored", (0, 2), 1)
    assert plan_save(entries, toks((100, 103)), 1, 100) == SavePlan(False, "held")
    assert plan_save(entries, [], 1, 100) == SavePlan(False, "empty")
    assert plan_save(entries, toks((0, 5)), 101, 100) == SavePlan(False, "too_large")
    assert plan_save(entries, toks((0, 5)), 10**12, 0) == SavePlan(True, "stored", (0, 2), 0)


def test_state_memory_error_shrinks_the_limit_as_llama_server() -> None:
    pc: PromptCache[str] = PromptCache(1000, 0)
    pc.save(toks((0, 10)), 300, Calls("A"))
    pc.save(toks((100, 110)), 300, Calls("B"))

    def oom() -> str:
        raise MemoryError

    assert pc.save(toks((200, 210)), 300, oom) is False
    assert pc.limit_bytes == 240  # 0.4 * 600
    assert pc.entries == ()
    assert [e.state for e in pc.update()] == ["A", "B"]


# -- load ---------------------------------------------------------------------------------------------------


def test_a_conversation_takes_its_state_back() -> None:
    pc: PromptCache[str] = PromptCache(0, 0)
    a1 = toks((0, 20))
    b1 = toks((0, 4), (1000, 1016))  # shares a 4-token system prompt with A
    a2 = [*a1, *range(20, 30)]
    slot, state = a1, "A"
    # B arrives: the slot would keep 4 of its 20 tokens; save A, nothing better for B.
    assert PromptCache.wants_update(slot, b1) is True
    assert pc.save(slot, 200, lambda: state) is True
    assert pc.take_better(slot, b1) is None
    assert pc.update() == []
    slot, state = b1, "B"
    # A returns with its next turn: save B, take A back.
    assert PromptCache.wants_update(slot, a2) is True
    assert pc.save(slot, 200, lambda: state) is True
    assert pc.take_better(slot, a2) == (a1, "A")
    assert [e.state for e in pc.entries] == ["B"]  # taken out of the cache
    s = pc.stats()
    assert (s.hits, s.misses, s.saves, s.entries) == (1, 1, 2, 1)


def test_take_better_needs_a_quarter_of_the_entry_kept() -> None:
    pc: PromptCache[str] = PromptCache(0, 0)
    pc.save(toks((0, 9)), 90, Calls("nine"))
    prompt = toks((0, 2), (500, 510))
    assert pc.take_better([], prompt) is None  # keeps 2/9 < 0.25 of it
    pc.save(toks((0, 2), (300, 306)), 80, Calls("eight"))
    assert pc.take_better([], prompt) == (toks((0, 2), (300, 306)), "eight")  # exactly 2/8 == 0.25


def test_take_better_needs_both_fractions_larger_than_the_slots() -> None:
    pc: PromptCache[str] = PromptCache(0, 0)
    prompt = toks((0, 10), (500, 510))
    pc.save(toks((0, 10), (300, 340)), 500, Calls("long"))  # keeps 10/50: under a quarter
    pc.save(toks((0, 6), (400, 408)), 140, Calls("short"))  # keeps 6/14 = 0.43, similarity 6/20
    slot = toks((0, 8), (600, 608))  # keeps 8/16 = 0.5, similarity 8/20
    assert pick_better([e.tokens for e in pc.entries], slot, prompt) is None
    slot = toks((0, 5), (600, 620))  # keeps 5/25 = 0.2, similarity 5/20: "short" is better in both
    assert pc.take_better(slot, prompt) == (toks((0, 6), (400, 408)), "short")


def test_take_better_ties_keep_the_earlier_entry_and_scan_in_order() -> None:
    prompt = toks((0, 10), (500, 510))
    e1 = toks((0, 6), (100, 106))  # keep 0.5, sim 0.3
    e2 = toks((0, 6), (200, 206))  # the same fractions
    e3 = toks((0, 8), (300, 302))  # keep 0.8, sim 0.4: better than e1 in both
    e4 = toks((0, 9), (400, 420))  # keep 9/29 (< 0.8), sim 0.45: not better than e3 in both
    assert pick_better([e1, e2], [], prompt) == 0
    assert pick_better([e2, e1], [], prompt) == 0
    assert pick_better([e1, e2, e3, e4], [], prompt) == 2
    assert pick_better([e4, e1], [], prompt) == 0  # e4 first, then e1 is not better in both: e4 wins
    assert pick_better([], [], prompt) is None
    assert pick_better([e1], [], []) is None  # an empty prompt: nothing is similar


# -- update -------------------------------------------------------------------------------------------------


def test_update_evicts_the_oldest_over_the_byte_limit() -> None:
    pc: PromptCache[str] = PromptCache(0, 0)
    for i, name in enumerate("ABC"):
        pc.save(toks((100 * i, 100 * i + 4)), 40, Calls(name))
    pc.limit_bytes = 100
    assert [e.state for e in pc.update()] == ["A"]
    assert [e.state for e in pc.entries] == ["B", "C"]


def test_the_token_limit_is_raised_by_the_byte_limit() -> None:
    def filled(limit_bytes: int, limit_tokens: int, nbytes: int) -> PromptCache[str]:
        pc: PromptCache[str] = PromptCache(limit_bytes, limit_tokens)
        for i, name in enumerate("ABC"):
            pc.save(toks((100 * i, 100 * i + 10)), nbytes, Calls(name))
        return pc

    # 30 tokens over a 10-token limit; at 10 bytes per token 1000 bytes hold 100 tokens: nothing goes.
    pc = filled(1000, 10, 100)
    assert pc.update() == []
    assert pc.n_tokens == 30
    # No byte limit: the token limit alone.
    pc = filled(0, 10, 100)
    assert [e.state for e in pc.update()] == ["A", "B"]
    # Under 1 byte per token counts as 1: 20 bytes raise a 5-token limit to 20 tokens.
    pc = filled(20, 5, 5)
    assert [e.state for e in pc.update()] == ["A"]
    assert (len(pc), pc.n_tokens, pc.nbytes) == (2, 20, 10)
    pc = filled(0, 5, 5)
    assert [e.state for e in pc.update()] == ["A", "B", "C"]
    # No token limit: no token eviction at all.
    assert filled(20, 0, 5).update() == []


def test_plan_update_is_pure() -> None:
    assert plan_update([(40, 4), (40, 4), (40, 4)], 100, 0) == 1
    assert plan_update([(40, 4), (40, 4), (40, 4)], 0, 0) == 0
    assert plan_update([(5, 10), (5, 10), (5, 10)], 20, 5) == 1
    assert plan_update([(100, 10), (100, 10)], 150, 5) == 1  # bytes first, then 10 <= max(5, 150/10)
    assert plan_update([], 100, 10) == 0


def test_update_returns_what_save_evicted_first() -> None:
    pc: PromptCache[str] = PromptCache(100, 0)
    pc.save(toks((0, 10)), 60, Calls("A"))
    pc.save(toks((100, 110)), 60, Calls("B"))  # evicts A to make room
    pc.limit_bytes = 50
    assert [e.state for e in pc.update()] == ["A", "B"]
    assert isinstance(pc.update(), list)


# -- the whole flow -----------------------------------------------------------------------------------------


def turn(
    pc: PromptCache[str],
    slot: list[int],
    state: str,
    prompt: list[int],
    nbytes: int,
) -> tuple[list[int], str, list[Entry[str]], bool]:
    """llama-server's get_available_slot with one slot: returns the slot after the update."""
    evicted: list[Entry[str]] = []
    if not PromptCache.wants_update(slot, prompt):
        return slot, state, evicted, False
    pc.save(slot, nbytes, lambda: state)
    got = pc.take_better(slot, prompt)
    if got is not None:
        slot, state = got
    return slot, state, pc.update(), got is not None


def test_interleaved_conversations_find_their_prefix_again() -> None:
    system = toks((0, 8))
    conv = {name: [*system, *range(100 * (i + 1), 100 * (i + 1) + 12)] for i, name in enumerate("ABC")}
    pc: PromptCache[str] = PromptCache(0, 4096)
    slot: list[int] = []
    state = ""
    loads: list[bool] = []
    for rnd in range(3):
        for name in "ABC":
            prompt = [*conv[name], *range(10_000 * (rnd + 1), 10_000 * (rnd + 1) + 3)]
            slot, state, evicted, loaded = turn(pc, slot, state, prompt, 10 * max(1, len(slot)))
            assert evicted == []
            loads.append(loaded)
            if rnd > 0:
                assert state == f"{name}{rnd - 1}"  # its own state came back
                assert lcp(slot, prompt) == len(conv[name])
            # The turn runs: the slot now holds the prompt and the reply.
            conv[name] = [*prompt, *range(50_000 + rnd * 10, 50_000 + rnd * 10 + 2)]
            slot, state = list(conv[name]), f"{name}{rnd}"
    assert loads == [False] * 3 + [True] * 6
    assert len(pc) == 2
    s = pc.stats()
    assert s == PromptCacheStats(
        entries=2,
        bytes=700,
        n_tokens=70,
        limit_bytes=0,
        limit_tokens=4096,
        saves=8,
        skipped=1,
        replaced=0,
        hits=6,
        misses=3,
        evictions=0,
        evicted_bytes=0,
    )
    with pytest.raises(AttributeError, match="immutable"):  # a frozen msgspec Struct
        s.hits = 0  # type: ignore[misc]


def test_default_limit_bytes(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_text("MemTotal:        8000000 kB\nMemAvailable:    4000000 kB\n")
    assert default_limit_bytes(str(small)) == 4000000 * 1024 // 4
    big = tmp_path / "big"
    big.write_text("MemAvailable:   640000000 kB\n")
    assert default_limit_bytes(str(big)) == DEFAULT_LIMIT_BYTES == 8192 << 20
    assert default_limit_bytes(str(tmp_path / "missing")) == 8192 << 20
    assert 0 < default_limit_bytes() <= 8192 << 20


def test_limits_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        PromptCache(-1, 0)


# -- turnstile's eviction order (held bytes) ------------------------------------------------------------


def _round_robin(cache: PromptCache[str], n_conv: int, rounds: int, *, then: int = 0) -> list[bool]:
    """The slot's flow for conversations taking turns (`TieredCache`): save the slot's previous conversation,
    load the speaker's entry (turnstile's rule: first), update, tick; each turn adds 10 tokens to its
    conversation, every state weighs 10 bytes. From the second round on the byte limit is `then` (if
    given). Returns hit per turn."""
    hist = {c: toks((1000 * c, 1000 * c + 10)) for c in range(n_conv)}
    slot: list[int] = []
    hits: list[bool] = []
    for r in range(rounds):
        if r == 1 and then:
            cache.limit_bytes = then
        for c in range(n_conv):
            prompt = hist[c]
            mine = [e for e in cache.entries if e.tokens == tuple(prompt)]
            if mine and cache.counts_held:  # turnstile's order (caches.tiered): a leaving entry goes first
                cache.take(mine[0], keep=False)
            cache.save(slot, 10, lambda: "state")
            if mine and not cache.counts_held:
                cache.take(mine[0], keep=False)
            cache.update()
            cache.tick()
            hits.append(bool(mine))
            hist[c] = slot = [*prompt, *range(1000 * c + len(prompt), 1000 * c + len(prompt) + 10)]
    return hits


def _sizes(entries: Sequence[Entry[str]]) -> int:
    return sum(e.nbytes for e in entries)  # nothing shared: the whole sizes


def test_round_robin_over_more_than_fit_keeps_most_conversations_instead_of_thrashing() -> None:
    # 6 conversations; after a first round where the 5 not in the slot fit, a limit that holds 4: LRU
    # (llama-server's order) evicts the conversation that speaks next, every turn; turnstile's order, which
    # has seen every state wait 5 requests, drops the ones that just spoke
    lru = _round_robin(PromptCache(50, 0), 6, 5, then=40)
    reuse = _round_robin(PromptCache(50, 0, held=_sizes), 6, 5, then=40)
    assert sum(lru[6:]) == 1  # the first turn of round 2, then every turn misses
    assert sum(reuse[6:]) == 19  # of 24: one miss a round (Belady would miss one in four)


def test_entries_already_loaded_go_before_the_others() -> None:
    cache: PromptCache[str] = PromptCache(0, 25, held=_sizes)
    cache.save(toks((0, 10)), 10, lambda: "a")
    cache.tick()
    cache.save(toks((100, 110)), 10, lambda: "b")
    cache.tick()
    a = cache.entries[0]
    assert cache.take(a, keep=True)  # a prompt used part of it: kept, marked used
    cache.tick()
    cache.save(toks((200, 210)), 10, lambda: "c")
    evicted = cache.update()
    assert [e.state for e in evicted] == ["a"]  # not the newest, though the newest is predicted furthest
    assert [e.state for e in cache.entries] == ["b", "c"]


def test_without_held_the_order_is_llama_servers_oldest_first() -> None:
    cache: PromptCache[str] = PromptCache(25, 0)
    for i, name in enumerate("abc"):
        cache.save(toks((100 * i, 100 * i + 10)), 10, lambda name=name: name)  # type: ignore[misc]
        cache.tick()
    assert [e.state for e in cache.update()] == ["a"]
