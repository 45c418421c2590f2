"""The disk tier with its in-memory index against a reference model that scans every entry.

Random workloads (token sequences with shared prefixes; puts, finds, removes, evictions, damaged state
records, reopening with another limit) run on two `DiskTier` objects sharing one directory; the model
applies the rules as the scan did before the index (`scan_rank` over every entry, usage sorted by last
use). Every answer, the entry set and the byte total must be the same.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import diskcache
import pytest

from caches.disk import store as disk_store
from caches.disk.format import KIND_INDEX, KIND_STATE, record_size, tokens_to_bytes
from caches.disk.index import scan_rank
from caches.disk.tier import DiskTier

FP = "model-sha256:0123abcd"
SETTINGS = "n_ctx=8192"

Tokens = tuple[int, ...]


@dataclass
class _Row:
    stamp: int
    nbytes: int
    payload: bytes
    damaged: bool = False


class Model:
    """The tier's rules as plain scans over a dict (a logical clock for the LRU order)."""

    def __init__(self, digest: DiskTier) -> None:
        self.rows: dict[Tokens, _Row] = {}
        self.clock = 0
        self._digest = digest

    def digest(self, toks: Tokens) -> str:
        return self._digest._digest(tokens_to_bytes(toks))

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    @property
    def total(self) -> int:
        return sum(r.nbytes for r in self.rows.values())

    def evict(self, limit: int, keep: Tokens | None) -> None:
        if not limit:
            return
        total = self.total
        for toks in sorted(self.rows, key=lambda t: (self.rows[t].stamp, self.digest(t))):
            if total <= limit:
                break
            if toks != keep:
                total -= self.rows.pop(toks).nbytes

    def put(self, toks: Tokens, payload: bytes, limit: int) -> bool:
        n = len(toks)
        nbytes = record_size(KIND_STATE, FP, SETTINGS, n, len(payload)) + record_size(
            KIND_INDEX, FP, SETTINGS, n, len(payload)
        )
        if not toks or (limit and nbytes > limit):
            return False
        self.rows[toks] = _Row(self.tick(), nbytes, payload)
        for other in list(self.rows):
            if len(other) < n and toks[: len(other)] == other:
                del self.rows[other]
        self.evict(limit, keep=toks)
        return True

    def find(self, prompt: Tokens, better_than: int) -> tuple[list[int], bytes] | None:
        by_digest = {self.digest(t): t for t in self.rows}
        for d, _kept in scan_rank(by_digest.items(), prompt, better_than):
            row = self.rows[by_digest[d]]
            if row.damaged:
                del self.rows[by_digest[d]]
                continue
            row.stamp = self.tick()
            return list(by_digest[d]), row.payload
        return None


def _tokens(rng: random.Random, stems: list[Tokens]) -> Tokens:
    stem = rng.choice(stems)
    cut = rng.choice([len(stem), len(stem), rng.randint(0, len(stem))])
    tail = tuple(rng.randint(0, 3) for _ in range(rng.randint(0 if cut else 1, 10)))
    return stem[:cut] + tail


def _damage(directory: Path, model: Model, toks: Tokens) -> None:
    """Overwrite the entry's state record with garbage, behind the tiers' backs (as a bad disk would)."""
    with diskcache.Cache(str(directory)) as raw:
        raw.set("turnstile:r:" + model.digest(toks), b"not a record")
    model.rows[toks].damaged = True


@pytest.mark.parametrize(("seed", "log_keep"), [(0, 1024), (1, 1024), (2, 1024), (3, 3), (4, 3), (5, 1)])
def test_two_tiers_choose_what_the_scan_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, log_keep: int
) -> None:
    monkeypatch.setattr(disk_store, "LOG_KEEP", log_keep)  # a short log: readers fall back to reloads
    rng = random.Random(seed)
    stems = [tuple(rng.randint(0, 3) for _ in range(rng.randint(4, 30))) for _ in range(3)]
    limits = {"a": 12_000, "b": 9_000}
    tiers = {
        name: DiskTier(tmp_path, fingerprint=FP, settings=SETTINGS, limit_bytes=lim) for name, lim in limits.items()
    }
    model = Model(tiers["a"])
    try:
        for step in range(500):
            name = rng.choice("ab")
            t = tiers[name]
            op = rng.random()
            where = (seed, step, name)
            if op < 0.4:
                toks = _tokens(rng, stems)
                data = rng.randbytes(rng.randint(50, 2500))
                assert t.put(toks, data) == model.put(toks, data, limits[name]), where
            elif op < 0.75:
                prompt = _tokens(rng, stems)
                better = rng.choice([0, 0, rng.randint(0, len(prompt))])
                assert t.find(prompt, better_than=better) == model.find(prompt, better), where
            elif op < 0.85 and model.rows:
                toks = rng.choice(sorted(model.rows))
                assert t.remove(toks) is True, where
                del model.rows[toks]
            elif op < 0.9 and model.rows:
                _damage(tmp_path, model, rng.choice(sorted(model.rows)))
            elif op < 0.93:
                tiers[name].close()
                limits[name] = rng.choice([0, 5_000, 9_000, 15_000])
                tiers[name] = DiskTier(tmp_path, fingerprint=FP, settings=SETTINGS, limit_bytes=limits[name])
                model.evict(limits[name], keep=None)
            for other in tiers.values():
                assert len(other) == len(model.rows), where
                assert {item.tokens for item in other._m.items.values()} == set(model.rows), where
                assert other.nbytes == model.total, where
    finally:
        for t in tiers.values():
            t.close()


def _statements(t: DiskTier, fn: Callable[[], object]) -> list[str]:
    seen: list[str] = []
    con = t._store.cache._con
    con.set_trace_callback(seen.append)
    try:
        fn()
    finally:
        con.set_trace_callback(None)
    return seen


def test_find_and_put_run_the_same_statements_whatever_the_number_of_entries(tmp_path: Path) -> None:
    """No call reads every row any more: the SQL a find or a put runs does not grow with the entries."""
    rng = random.Random(5)
    system = [rng.randrange(1000) for _ in range(60)]
    counts = []
    for n in (10, 200):
        with DiskTier(tmp_path / str(n), fingerprint=FP, settings=SETTINGS, limit_bytes=0) as t:
            stored = [[*system, *(rng.randrange(1000) for _ in range(20))] for _ in range(n)]
            for toks in stored:
                assert t.put(toks, b"x" * 100)
            back = stored[n // 2]
            find = _statements(t, partial(t.find, [*back, 1, 2, 3]))
            new = [*system, *(rng.randrange(1000) for _ in range(20))]
            put = _statements(t, partial(t.put, new, b"y" * 100))
            counts.append((len(find), len(put)))
            assert not [s for s in find + put if "LIKE" in s or "ORDER BY" in s]
    assert counts[0] == counts[1]


def test_many_sessions_benchmark_writes_its_table(tmp_path: Path) -> None:
    from benchmarks import many_sessions

    many_sessions.main(["--sizes", "5,20", "--samples", "4", "--system", "30", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "many-sessions.json").read_text())
    assert doc["benchmark"] == "many-sessions"
    assert [r["stored"] for r in doc["rows"]] == [5, 20]
    for r in doc["rows"]:
        assert 0 < r["find_p50_ms"] <= r["find_p99_ms"]
        assert 0 < r["put_p50_ms"] <= r["put_p99_ms"]
        assert r["open_ms"] > 0
