"""The llama_cache state caches: RAM, trie and disk (lookup semantics, LRU by bytes, the disk format),
and each one as a real `llama_cpp.Llama.set_cache` cache on the tiny llama model."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import diskcache.core
import llama_cpp
import llama_cpp.llama_cache
import numpy as np
import pytest
from llama_cpp.llama import LlamaState

import caches
import caches.llama_cache
from caches.llama_cache import (
    BaseLlamaCache,
    HybridCheckpoint,
    HybridCheckpointCache,
    LlamaCache,
    LlamaDiskCache,
    LlamaRAMCache,
    LlamaTrieCache,
    TrieNode,
)
from caches.llama_cache.base import common_prefix_len
from caches.llama_cache.disk import decode_key, decode_state, encode_key, encode_state
from runtime.log import capture_logs


class Fake:
    """A cached value with an explicit `nbytes`."""

    def __init__(self, nbytes: int, tag: str = "") -> None:
        self.nbytes = nbytes
        self.tag = tag


class Legacy:
    """A cached value with only `llama_state_size` (as 0.3.36's LlamaState)."""

    def __init__(self, size: int) -> None:
        self.llama_state_size = size


def make_state(n_state: int = 3, seed: int = 7, rows: int = 3, cols: int = 4) -> LlamaState:
    rng = np.random.default_rng(n_state + rows)
    return LlamaState(
        input_ids=np.arange(10, dtype=np.intc) - 2,
        scores=rng.standard_normal((rows, cols)).astype(np.single),
        n_tokens=rows,
        llama_state=bytes(rng.integers(0, 256, n_state, dtype=np.uint8)),
        llama_state_size=n_state,
        seed=seed,
    )


def assert_same_state(a: LlamaState, b: LlamaState) -> None:
    assert a.input_ids.dtype == b.input_ids.dtype and np.array_equal(a.input_ids, b.input_ids)
    assert a.scores.dtype == b.scores.dtype and a.scores.shape == b.scores.shape
    assert np.array_equal(a.scores, b.scores)
    assert (a.n_tokens, a.llama_state, a.llama_state_size, a.seed) == (
        b.n_tokens,
        b.llama_state,
        b.llama_state_size,
        b.seed,
    )


def lru_keys(cache: BaseLlamaCache) -> list[tuple[int, ...]]:
    if isinstance(cache, LlamaRAMCache):
        return list(cache.cache_state)
    if isinstance(cache, LlamaTrieCache):
        return list(cache.lru_tracker)
    assert isinstance(cache, LlamaDiskCache)
    return [decode_key(k) for k in cache.cache.iterkeys()]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[LlamaDiskCache]:
    cache = LlamaDiskCache(str(tmp_path / "dc"), capacity_bytes=1 << 30)
    yield cache
    cache.close()


def test_public_names() -> None:
    for name in (
        "BaseLlamaCache",
        "LlamaRAMCache",
        "LlamaDiskCache",
        "TrieNode",
        "LlamaTrieCache",
        "LlamaCache",
        "HybridCheckpoint",
        "HybridCheckpointCache",
    ):
        assert name in caches.llama_cache.__all__ and not hasattr(caches, name)
    assert LlamaCache is LlamaTrieCache
    assert HybridCheckpoint.__module__ == "caches.llama_cache.hybrid_checkpoint"
    assert issubclass(HybridCheckpointCache, BaseLlamaCache)
    # our caches are llama-cpp-python caches too
    assert issubclass(BaseLlamaCache, llama_cpp.llama_cache.BaseLlamaCache)
    assert LlamaRAMCache().capacity_bytes == LlamaTrieCache().capacity_bytes == 2 << 30
    assert LlamaRAMCache().verbose is False
    node = TrieNode()
    assert node.children == {} and node.state is None


def test_common_prefix_len_matches_a_plain_loop() -> None:
    rng = np.random.default_rng(0)

    def plain(a: Sequence[int], b: Sequence[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    for _ in range(2000):
        a = tuple(int(t) for t in rng.integers(0, 3, rng.integers(0, 40)))
        b = tuple(int(t) for t in rng.integers(0, 3, rng.integers(0, 40)))
        assert common_prefix_len(a, b) == plain(a, b)
        assert common_prefix_len(encode_key(a), encode_key(b)) // 4 == plain(a, b)


@pytest.mark.parametrize("cls", [LlamaRAMCache, LlamaTrieCache])
def test_lru_eviction_order_by_bytes(cls: type[LlamaRAMCache | LlamaTrieCache]) -> None:
    cache = cls(capacity_bytes=100)
    cache[(1,)] = Fake(40)  # type: ignore[assignment]
    cache[(2,)] = Fake(30)  # type: ignore[assignment]
    cache[(3,)] = Fake(30)  # type: ignore[assignment]
    assert cache.cache_size == 100 and lru_keys(cache) == [(1,), (2,), (3,)]  # at capacity: nothing goes
    assert (2,) in cache  # membership does not count as a use
    cache[(1, 5)]  # a use of (1,): most recent now
    assert lru_keys(cache) == [(2,), (3,), (1,)]
    with capture_logs() as logs:
        cache[(4,)] = Fake(25)  # type: ignore[assignment]
    assert lru_keys(cache) == [(3,), (1,), (4,)] and cache.cache_size == 95
    assert [e["nbytes"] for e in logs if e["event"] == "llama_cache.evict"] == [30]
    cache[(5,)] = Fake(60)  # type: ignore[assignment]  # 155: (3,) then (1,) go
    assert lru_keys(cache) == [(4,), (5,)] and cache.cache_size == 85
    assert len(cache) == 2
    cache[(6,)] = Fake(101)  # type: ignore[assignment]  # larger than the cache: everything goes
    assert lru_keys(cache) == [] and cache.cache_size == 0
    if isinstance(cache, LlamaTrieCache):
        assert cache.root.children == {}  # the trie is pruned


@pytest.mark.parametrize("cls", [LlamaRAMCache, LlamaTrieCache])
def test_replace_keeps_size_exact(cls: type[LlamaRAMCache | LlamaTrieCache]) -> None:
    cache = cls(capacity_bytes=100)
    cache[(1, 2)] = Fake(40)  # type: ignore[assignment]
    cache[(3,)] = Legacy(20)  # type: ignore[assignment]  # falls back to llama_state_size
    assert cache.cache_size == 60
    for size in (10, 50, 70, 5):
        cache[(1, 2)] = Fake(size, tag=str(size))  # type: ignore[assignment]
        assert cache.cache_size == size + 20
    assert cache[(1, 2)].tag == "5"  # type: ignore[attr-defined]
    assert cache.cache_size == 25 and len(cache) == 2
    cache[(3,)] = Fake(96)  # type: ignore[assignment]  # replace, over capacity: the other entry goes
    assert lru_keys(cache) == [(3,)] and cache.cache_size == 96
    with pytest.raises(TypeError):
        cache[(9,)] = object()  # type: ignore[assignment]
    assert cache.cache_size == 96 and len(cache) == 1


def test_ram_and_trie_lookup_semantics_on_the_same_keys(disk: LlamaDiskCache) -> None:
    ram, trie = LlamaRAMCache(), LlamaTrieCache()
    for cache in (ram, trie, disk):
        for key, label in (((1, 2, 3, 4), "A"), ((1, 2, 9), "B")):
            cache[key] = Fake(1, label) if cache is not disk else make_state(seed=ord(label))  # type: ignore[assignment]

    def tag(cache: BaseLlamaCache, query: Sequence[int]) -> str | None:
        try:
            value = cache[query]
        except KeyError:
            return None
        return chr(value.seed) if isinstance(value, LlamaState) else value.tag

    # a key that diverges from the query: RAM and disk take the longest common prefix, the trie does not
    assert tag(ram, (1, 2, 3, 5)) == tag(disk, (1, 2, 3, 5)) == "A"
    assert tag(trie, (1, 2, 3, 5)) is None and (1, 2, 3, 5) not in trie
    assert (1, 2, 3, 5) in ram and (1, 2, 3, 5) in disk
    assert tag(ram, (1, 2)) in ("A", "B")  # shorter than every key: still a match (a tie)
    assert tag(trie, (1, 2)) is None
    # a key that is wholly a prefix of the query: all agree
    for cache in (ram, trie, disk):
        assert tag(cache, (1, 2, 3, 4, 7, 7)) == "A"
        assert tag(cache, (1, 2, 9)) == "B"
        assert tag(cache, (7, 1, 2)) is None  # no non-empty common prefix
    # the trie takes the longest cached prefix, down to the empty key
    trie[(1, 2)] = Fake(1, "C")  # type: ignore[assignment]
    ram[(1, 2)] = Fake(1, "C")  # type: ignore[assignment]
    assert tag(trie, (1, 2, 3, 5)) == "C" and tag(ram, (1, 2, 3, 5)) == "A"
    trie[()] = Fake(1, "E")  # type: ignore[assignment]
    ram[()] = Fake(1, "E")  # type: ignore[assignment]
    assert tag(trie, (7,)) == "E" and tag(ram, (7,)) is None
    with pytest.raises(KeyError, match="Cache is empty"):
        LlamaRAMCache()[(1,)]
    with pytest.raises(KeyError):
        LlamaTrieCache()[(1,)]


def test_trie_prune_keeps_shared_prefixes() -> None:
    trie = LlamaTrieCache(capacity_bytes=10)
    trie[(1, 2, 3)] = Fake(5)  # type: ignore[assignment]
    trie[(1, 2, 4, 5)] = Fake(5)  # type: ignore[assignment]
    trie[(9,)] = Fake(5)  # type: ignore[assignment]  # evicts (1, 2, 3)
    assert lru_keys(trie) == [(1, 2, 4, 5), (9,)]
    assert list(trie.root.children[1].children[2].children) == [4]
    assert (1, 2, 3) not in trie and (1, 2, 4, 5, 6) in trie


# --- the disk cache ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7, -1, 2**32])
def test_state_encoding_round_trips(seed: int) -> None:
    state = make_state(n_state=1000, seed=seed, rows=5, cols=17)
    assert_same_state(decode_state(encode_state(state)), state)
    empty = LlamaState(np.zeros(0, np.intc), np.zeros((0, 4), np.single), 0, b"", 0, 1)
    assert_same_state(decode_state(encode_state(empty)), empty)
    assert decode_key(encode_key((1, -2, 3))) == (1, -2, 3)
    assert encode_key((1, 256)) == b"\x01\x00\x00\x00\x00\x01\x00\x00"


def test_disk_survives_reopen_and_reads_are_not_destructive(tmp_path: Path) -> None:
    path = str(tmp_path / "dc")
    cache = LlamaDiskCache(path, capacity_bytes=10 << 20)
    assert cache.cache_dir == path and cache.cache.size_limit == 10 << 20
    state = make_state(n_state=100_000)  # large: a file beside the database
    small = make_state(n_state=10, seed=3)
    cache[(5, 6, 7)] = state
    cache[(8,)] = small
    assert cache.cache_size > 100_000
    assert_same_state(cache[(5, 6, 7, 8)], state)
    assert_same_state(cache[(5, 6, 7, 8)], state)  # read twice: still there
    cache.close()
    reopened = LlamaDiskCache(path, capacity_bytes=10 << 20)
    try:
        assert len(reopened) == 2
        assert_same_state(reopened[(5, 6, 9)], state)
        assert_same_state(reopened[(8, 1)], small)
        assert (5,) in reopened and (4,) not in reopened
        reopened[(5, 6, 7)] = small  # replace
        assert_same_state(reopened[(5, 6, 7)], small)
        assert len(reopened) == 2
    finally:
        reopened.close()


def _flip(raw: bytes, offset: int) -> bytes:
    b = bytearray(raw)
    b[offset] ^= 0x10
    return bytes(b)


@pytest.mark.parametrize("where", ["db", "file"])
@pytest.mark.parametrize("offset", [0, 9, 60, "mid", -1])
def test_flipped_byte_is_a_miss(tmp_path: Path, where: str, offset: int | str) -> None:
    path = tmp_path / "dc"
    cache = LlamaDiskCache(str(path))
    try:
        good = make_state(n_state=10, seed=1)
        bad = make_state(n_state=10 if where == "db" else 100_000, seed=2)
        cache[(1, 2)] = good
        cache[(1, 2, 3, 4)] = bad
        raw_key = encode_key((1, 2, 3, 4))
        with sqlite3.connect(path / diskcache.core.DBNAME) as db:
            ((value, filename),) = db.execute("SELECT value, filename FROM Cache WHERE key = ?", (raw_key,))
            if where == "db":
                assert filename is None
                off = len(value) // 2 if offset == "mid" else int(offset)
                db.execute("UPDATE Cache SET value = ? WHERE key = ?", (_flip(value, off), raw_key))
            else:
                assert value is None and filename
                file = path / filename
                data = file.read_bytes()
                off = len(data) // 2 if offset == "mid" else int(offset)
                file.write_bytes(_flip(data, off))
        with capture_logs() as logs:
            assert_same_state(cache[(1, 2, 3, 4, 5)], good)  # the damaged entry is skipped: the next best
        [warning] = [e for e in logs if e["event"] == "llama_cache.disk.damaged"]
        assert warning["log_level"] == "warning" and warning["key_len"] == 4
        assert lru_keys(cache) == [(1, 2)]  # dropped
        cache.cache.delete(encode_key((1, 2)))
        cache[(1, 2, 3)] = bad
        with sqlite3.connect(path / diskcache.core.DBNAME) as db:
            db.execute(
                "UPDATE Cache SET value = ?, filename = NULL, mode = 1 WHERE key = ?",
                (b"LCST garbage", encode_key((1, 2, 3))),
            )
        with pytest.raises(KeyError, match="Key not found"):  # a miss, as Llama expects
            cache[(1, 2, 3)]
        assert len(cache) == 0
    finally:
        cache.close()


def test_disk_database_holds_no_pickles(disk: LlamaDiskCache) -> None:
    disk[(1, 2, 3)] = make_state(n_state=10)
    disk[(4, 5)] = make_state(n_state=100_000)
    disk[()] = make_state(n_state=1)
    with sqlite3.connect(Path(disk.cache_dir) / diskcache.core.DBNAME) as db:
        rows = list(db.execute("SELECT key, raw, mode, value, filename FROM Cache"))
    assert len(rows) == 3
    for key, raw, mode, value, filename in rows:
        assert raw == 1 and isinstance(key, bytes)  # the key is stored as bytes, not a pickled tuple
        assert mode in (1, 2)  # diskcache MODE_RAW (in the database) or MODE_BINARY (a file); 4 is pickle
        data = value if filename is None else (Path(disk.cache_dir) / filename).read_bytes()
        assert data[:4] == b"LCST" and not data.startswith(b"\x80")


# --- as Llama.set_cache caches ------------------------------------------------------------------------


class CountingLlama(llama_cpp.Llama):
    """A Llama that counts the tokens it evaluates."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.evaluated = 0

    def eval(self, tokens: Sequence[int]) -> None:
        self.evaluated += len(tokens)
        super().eval(tokens)


@pytest.fixture(scope="module")
def llm(tiny_models: dict[str, Path]) -> Iterator[CountingLlama]:
    model = CountingLlama(str(tiny_models["llama"]), n_ctx=512, n_batch=512, verbose=False, seed=1)
    yield model
    model.close()


@pytest.mark.parametrize("kind", ["ram", "trie", "disk"])
def test_set_cache_loads_the_state_of_a_shared_prefix(llm: CountingLlama, tmp_path: Path, kind: str) -> None:
    cache: BaseLlamaCache = (
        {"ram": LlamaRAMCache, "trie": LlamaTrieCache}[kind]()
        if kind != "disk"
        else (LlamaDiskCache(str(tmp_path / "dc")))
    )
    first = llm.tokenize(b"hello world the cat and the dog tell me a story about the sea", add_bos=False)
    other = llm.tokenize(b"yes no maybe okay thanks", add_bos=False)
    more = llm.tokenize(b" tell me more about the ship", add_bos=False)
    assert first[0] != other[0]
    try:
        llm.set_cache(cache)
        llm.reset()
        llm.create_completion(first, max_tokens=4, temperature=0.0)  # saved under first + completion
        [key] = lru_keys(cache)
        assert list(key[: len(first)]) == first and len(key) == len(first) + 4
        llm.create_completion(other, max_tokens=1, temperature=0.0)  # the context moves away
        prompt = list(key) + more
        llm.evaluated = 0
        cached = llm.create_completion(prompt, max_tokens=3, temperature=0.0)
        # the shared prefix came from the cache (3 tokens: 2 generated are evaluated, the 3rd is not)
        assert llm.evaluated <= len(prompt) - len(first) + 2 < len(prompt)

        llm.set_cache(None)  # the same without a cache: everything is computed, to the same answer
        llm.reset()
        llm.create_completion(other, max_tokens=1, temperature=0.0)
        llm.evaluated = 0
        fresh = llm.create_completion(prompt, max_tokens=3, temperature=0.0)
        assert llm.evaluated == len(prompt) + 2
        assert cached["choices"][0]["text"] == fresh["choices"][0]["text"]
    finally:
        llm.set_cache(None)
        if isinstance(cache, LlamaDiskCache):
            cache.close()
