"""The disk tier's token trie (`caches.disk.index.TokenIndex`) against the reference scan (`scan_rank`)."""

from __future__ import annotations

import random

import pytest

from caches.disk.index import TokenIndex, scan_rank


def test_best_keeps_the_most_then_the_shortest_then_the_smallest_digest() -> None:
    idx = TokenIndex()
    idx.add("a", (1, 2, 3, 4, 5, 6, 7, 8))
    idx.add("b", (1, 2, 3, 9))
    idx.add("c", (1, 2, 3, 10))
    assert len(idx) == 3
    assert idx.best((1, 2, 3, 4, 5)) == ("a", 5)
    assert idx.best((1, 2, 3)) == ("b", 3)  # all keep 3: the shorter ones, then the smaller digest
    assert idx.best((1, 2, 3, 10, 11)) == ("c", 4)
    assert idx.best((1, 2)) == ("b", 2)  # 2/4 >= 0.25
    assert idx.best((1,)) == ("b", 1)  # 1/4 == 0.25 exactly: a candidate
    assert idx.best((1, 2, 3), better_than=3) is None
    assert idx.best((1, 2, 3, 4, 5), better_than=4) == ("a", 5)
    assert idx.best((2, 1)) is None
    assert idx.best(()) is None
    assert idx.prefixes((1, 2, 3, 9, 4)) == ["b"]
    assert idx.prefixes((1, 2, 3, 9)) == []  # not a proper prefix of itself
    assert idx.remove("b", (1, 2, 3, 9)) is True
    assert idx.remove("b", (1, 2, 3, 9)) is False
    assert idx.best((1,)) == ("c", 1)  # c keeps 1/4; a keeps 1/8
    assert idx.best((1, 2, 3, 9)) == ("c", 3)
    assert len(idx) == 2


def test_a_quarter_is_computed_in_single_precision() -> None:
    idx = TokenIndex()
    long = tuple(range(1, 41))
    idx.add("x", long)
    assert idx.best(long[:10]) == ("x", 10)  # 10/40 == 0.25
    assert idx.best(long[:9]) is None  # 9/40 < 0.25
    assert scan_rank([("x", long)], long[:10]) == [("x", 10)]
    assert scan_rank([("x", long)], long[:9]) == []


def test_entries_on_one_path_and_removal_folds_the_trie() -> None:
    idx = TokenIndex()
    idx.add("short", (5, 6))
    idx.add("long", (5, 6, 7, 8, 9))
    idx.add("other", (5, 6, 7, 1))
    assert idx.prefixes((5, 6, 7, 8, 9, 10)) == ["short", "long"]
    assert idx.best((5, 6, 7, 8)) == ("long", 4)
    assert idx.remove("short", (5, 6)) is True
    assert idx.remove("long", (5, 6, 7, 8)) is False  # not an entry
    assert idx.best((5, 6, 0)) == ("other", 2)
    assert idx.remove("other", (5, 6, 7, 1)) is True
    assert idx.best((5, 6, 7, 8, 9)) == ("long", 5)
    assert idx.remove("long", (5, 6, 7, 8, 9)) is True
    assert len(idx) == 0
    assert idx.best((5, 6)) is None
    with pytest.raises(ValueError):
        idx.add("empty", ())


def _random_tokens(rng: random.Random, stems: list[tuple[int, ...]]) -> tuple[int, ...]:
    stem = rng.choice(stems)
    cut = rng.randint(0, len(stem))
    tail = tuple(rng.randint(0, 3) for _ in range(rng.randint(0 if cut else 1, 12)))
    return stem[:cut] + tail


@pytest.mark.parametrize("seed", range(6))
def test_best_and_prefixes_equal_the_reference_scan(seed: int) -> None:
    rng = random.Random(seed)
    stems = [tuple(rng.randint(0, 3) for _ in range(rng.randint(1, 40))) for _ in range(4)]
    idx = TokenIndex()
    entries: dict[tuple[int, ...], str] = {}
    for step in range(1500):
        op = rng.random()
        if op < 0.45:
            toks = _random_tokens(rng, stems)
            d = f"{rng.getrandbits(32):08x}" if toks not in entries else entries[toks]
            idx.add(d, toks)
            entries[toks] = d
        elif op < 0.7 and entries:
            toks = rng.choice(sorted(entries))
            assert idx.remove(entries.pop(toks), toks) is True
        else:
            prompt = _random_tokens(rng, stems)
            better = rng.choice([0, 0, 1, rng.randint(0, len(prompt) + 1)])
            ranked = scan_rank(((d, t) for t, d in entries.items()), prompt, better)
            assert idx.best(prompt, better) == (ranked[0] if ranked else None), (seed, step)
            want = sorted(d for t, d in entries.items() if len(t) < len(prompt) and prompt[: len(t)] == t)
            assert sorted(idx.prefixes(prompt)) == want
        assert len(idx) == len(entries)
