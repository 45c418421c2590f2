"""The n-gram index and drafter, without a model: the index equals a brute-force scan through appends,
truncations and syncs; lookups pick the occurrence that matches furthest back; the draft length adapts."""

from __future__ import annotations

import random

import pytest

from runtime.slot.ngram import Drafter, DraftLength, NgramIndex, _best_length


def brute(tokens: list[int], n: int) -> dict[tuple[int, ...], list[int]]:
    out: dict[tuple[int, ...], list[int]] = {}
    for i in range(n, len(tokens)):
        out.setdefault(tuple(tokens[i - n : i]), []).append(i)
    return out


def check(index: NgramIndex, tokens: list[int]) -> None:
    assert index.tokens == tokens
    want = brute(tokens, index.n)
    assert index._follow == want  # the whole map: no stale or missing positions


@pytest.mark.parametrize("n", [1, 2, 4])
def test_index_equals_a_scan_through_random_edits(n: int) -> None:
    rng = random.Random(n)
    index = NgramIndex(n)
    tokens: list[int] = []
    for _ in range(300):
        op = rng.random()
        if op < 0.5:
            t = rng.randrange(6)  # a small alphabet: many repeated n-grams
            index.append(t)
            tokens.append(t)
        elif op < 0.7:
            m = rng.randrange(len(tokens) + 1)
            index.truncate(m)
            del tokens[m:]
        elif op < 0.85:
            new = [rng.randrange(6) for _ in range(rng.randrange(12))]
            index.extend(new)
            tokens += new
        else:  # another conversation's tokens: share a prefix, then differ
            keep = rng.randrange(len(tokens) + 1)
            tokens = tokens[:keep] + [rng.randrange(6) for _ in range(rng.randrange(20))]
            changed = index.sync(tokens)
            assert changed <= len(tokens)
        check(index, tokens)


def test_sync_reindexes_only_past_the_common_prefix() -> None:
    index = NgramIndex(2)
    assert index.sync([1, 2, 3, 4]) == 4
    assert index.sync([1, 2, 3, 4, 5]) == 1
    assert index.sync([1, 2, 9]) == 1
    check(index, [1, 2, 9])


def test_lookup_prefers_the_occurrence_that_matches_furthest_back() -> None:
    index = NgramIndex(2)
    # "7 1 2 -> 3" early, "8 1 2 -> 4" later; the tail is "... 7 1" and the sampled token is 2
    tokens = [7, 1, 2, 3, 0, 8, 1, 2, 4, 0, 7, 1]
    index.extend(tokens)
    pos, length = index.lookup(2)
    assert (pos, length) == (3, 3)  # 7 1 2 matches three back; the later "1 2" only two
    assert index.tokens[pos] == 3
    # the latest occurrence wins a tie
    index2 = NgramIndex(2)
    index2.extend([1, 2, 3, 1, 2, 4, 5, 1])
    assert index2.lookup(2) == (5, 2)
    assert index2.lookup(9) == (0, 0)  # never seen


def test_drafter_copies_what_followed_and_respects_room() -> None:
    passage = list(range(100, 140))
    index = NgramIndex(4)
    index.extend([*passage, 1, 2, *passage[:10]])  # the passage, then a copy of it under way
    d = Drafter(index, DraftLength(cap=32, limit=32))
    draft = d.draft(passage[10], room=100)
    # the 4-gram match reaches 11 tokens back: 2^(11 - 4 + 1) allowed, capped at 32
    assert draft == [*passage[11:], 1, 2, passage[0]]  # what followed, on into what came after it
    assert d.draft(passage[10], room=3) == passage[11:14]
    assert d.draft(passage[10], room=0) == []
    assert d.draft(999, room=10) == []
    short = NgramIndex(4)
    short.extend([9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3])
    assert Drafter(short).draft(4, room=10) == [5, 6]  # a bare 4-gram match drafts two tokens


def test_draft_length_grows_on_full_acceptance_and_backs_off_on_misses() -> None:
    dl = DraftLength(cap=32, limit=8)
    assert dl.allowed(match_len=4, n=4) == 2
    assert dl.allowed(match_len=5, n=4) == 4
    assert dl.allowed(match_len=64, n=4) == 8
    assert dl.allowed(match_len=3, n=4) == 0
    dl.update(8, 8)
    assert dl.limit == 16
    dl.update(16, 16)
    dl.update(32, 32)
    assert dl.limit == 32  # capped
    dl.update(32, 5)
    assert dl.limit == 6  # what was accepted, plus one
    dl.update(6, 0)
    assert (dl.limit, dl.cooldown) == (3, 1)
    assert dl.allowed(64, 4) == 0  # the cooldown step
    assert dl.allowed(64, 4) == 3
    dl.update(3, 0)
    assert dl.cooldown == 2  # doubles with each miss in a row
    dl.update(2, 1)
    assert dl.misses == 0


def test_short_matches_stop_drafting_when_drafts_are_rejected() -> None:
    dl = DraftLength(cap=32, limit=8)
    dl.update(2, 0)  # rate 1.0 -> 0.7
    dl.cooldown = 0
    assert dl.allowed(match_len=4, n=4) == 2  # still above the gate
    dl.update(2, 0)  # 0.49: under it
    dl.cooldown = 0
    assert round(dl.rate, 2) == 0.49
    assert dl.allowed(match_len=4, n=4) == 0  # a chance match drafts nothing any more
    assert dl.allowed(match_len=5, n=4) == 0
    assert dl.allowed(match_len=6, n=4) == 2  # a real copy still does (limit fell to 2)
    dl.update(2, 2)  # 0.643: drafts pay again
    assert dl.allowed(match_len=4, n=4) == 2


def test_a_draft_ends_at_an_end_of_generation_token() -> None:
    index = NgramIndex(4)
    index.extend([1, 2, 3, 4, 5, 0, 7, 8, 1, 2, 3])  # 0 ends a reply
    d = Drafter(index, DraftLength(cap=32, limit=32), ends=lambda t: t == 0)
    assert d.draft(4, room=10) == [5, 0]  # nothing past the end is evaluated
    assert Drafter(index, DraftLength(cap=32, limit=32)).draft(4, room=10) == [5, 0]  # 2^1: two anyway
    index.extend([4, 5, 0, 7, 8, 1, 2, 3])
    assert Drafter(index, DraftLength(cap=32, limit=32)).draft(4, room=10)[:4] == [5, 0, 7, 8]
    assert Drafter(index, DraftLength(cap=32, limit=32), ends=lambda t: t == 0).draft(4, room=10) == [5, 0]


def test_drafter_counts() -> None:
    index = NgramIndex(1)
    index.extend([5, 6, 7])
    d = Drafter(index)
    d.accepted_n(4, 3)
    d.accepted_n(2, 0)
    assert (d.drafted, d.accepted) == (6, 3)


def test_draft_length_is_bounded_by_what_pays_once_a_draft_breaks() -> None:
    """A drafted token costs ~0.44 of a step: the best length for a per-token acceptance q is the argmax of
    (1 + E[accepted]) / (1 + 0.44 k); it bounds the drafts only after a draft that was not accepted whole."""
    assert [_best_length(q, 0.44, 32) for q in (0.5, 0.9, 0.95, 0.99, 1.0)] == [1, 4, 6, 15, 32]
    dl = DraftLength(cap=32, limit=32)
    assert dl.allowed(20, 4) == 32  # a long match, nothing rejected yet: the ramp alone
    dl.update(32, 32)
    assert dl.allowed(20, 4) == 32  # still no break (worth would say 10: q = 51/52)
    dl.update(32, 30)  # a copy that ended: kept 62, one break, q = 81/83
    assert (dl.limit, dl.worth(), dl.allowed(20, 4)) == (31, 9, 9)
    dl.update(8, 0)  # nothing accepted: a cooldown, and q = 81/84
    assert (dl.cooldown, dl.worth()) == (1, 7)
