"""HybridCheckpointCache on tiny recurrent (mamba), hybrid (jamba) and sliding-window (gemma3) models."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from caches.llama_cache import HybridCheckpoint, HybridCheckpointCache
from caches.llama_cache.hybrid_checkpoint import close_context_caches, registered_caches
from runtime.llama.engine import Engine
from runtime.log import capture_logs

TEXT = "hello world the cat and the dog tell me a story about the sea and the ship " * 2
OTHER = "yes no maybe okay thanks please sure what why how when where who"


@pytest.fixture
def engines(make_engine: Callable[[Path], Engine], tiny_models: dict[str, Path]) -> Iterator[Callable[[str], Engine]]:
    """Engines by architecture; their checkpoint caches are closed before the engines are freed."""
    opened: list[Engine] = []

    def get(arch: str) -> Engine:
        eng = make_engine(tiny_models[arch])
        opened.append(eng)
        return eng

    yield get
    for eng in opened:
        close_context_caches(eng.ctx)


def decode_in_steps(eng: Engine, tokens: list[int], start: int, step: int) -> None:
    for i in range(start, len(tokens), step):
        eng.decode(tokens[i : i + step], i)


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("arch", ["mamba", "jamba", "gemma3"])
def test_restore_gives_bit_identical_logits(engines: Callable[[str], Engine], arch: str, on_device: bool) -> None:
    eng = engines(arch)
    toks, other = eng.tokenize(TEXT), eng.tokenize(OTHER)
    k = 8 if arch == "gemma3" else 24  # gemma3: before its 16-token window fills (the state then grows)
    cache = HybridCheckpointCache(eng.ctx, on_device=on_device)
    eng.decode(toks[:k], 0)
    with capture_logs() as logs:
        assert cache.save_checkpoint(k, toks)
    [saved] = [e for e in logs if e["event"] == "checkpoint.save"]
    assert saved["pos"] == k and saved["pos_max"] == k - 1
    decode_in_steps(eng, toks[: k + 30], k, 10)  # go past the checkpoint
    assert eng.pos_max() == k + 29

    query = toks[:k] + other
    cp = cache.find_best_checkpoint(query)
    assert cp is not None and cp.pos == k and cp.pos_max == k - 1 and cp.seq_id == 0
    assert cp.size == len(cp.data) == cache.cache_size
    with capture_logs() as logs:
        assert cache.restore_checkpoint(cp)
    assert [e["event"] for e in logs if e["event"].startswith("checkpoint.")] == ["checkpoint.restore"]
    assert eng.pos_max() == k - 1
    eng.decode(other, k)
    restored = eng.logits()
    assert cache.find_best_checkpoint(query) is cp  # still valid: its range is before the removed suffix

    eng.clear()  # a run that never went past k
    eng.decode(toks[:k], 0)
    eng.decode(other, k)
    assert np.array_equal(restored, eng.logits())


@pytest.mark.parametrize("arch", ["mamba", "jamba"])
def test_find_needs_the_same_token_prefix(engines: Callable[[str], Engine], arch: str) -> None:
    eng = engines(arch)
    toks, other = eng.tokenize(TEXT), eng.tokenize(OTHER)
    cache = HybridCheckpointCache(eng.ctx)
    eng.decode(toks[:10], 0)
    assert cache.save_checkpoint(10, toks, seq_id=0) is True
    eng.decode(toks[10:20], 10)
    assert cache.save_checkpoint(20, toks, seq_id=0) is True
    assert [cp.pos for cp in cache.checkpoints] == [10, 20]
    assert cache.find_best_checkpoint(other[:10] + toks[10:20]) is None  # same length, another prefix
    assert cache.find_best_checkpoint(toks[:10] + other)
    assert cache.find_best_checkpoint(toks[:10] + other).pos == 10  # type: ignore[union-attr]
    assert cache.find_best_checkpoint(toks[:25]).pos == 20  # type: ignore[union-attr]
    assert cache.find_best_checkpoint(toks[:19]).pos == 10  # type: ignore[union-attr]
    assert cache.find_best_checkpoint(toks[:9]) is None
    assert cache.find_best_checkpoint(toks, seq_id=1) is None
    assert cache._hash_prefix(toks, 0) == "empty" and len(cache._hash_prefix(toks, 5)) == 32
    with pytest.raises(ValueError):
        cache.save_checkpoint(len(toks) + 1, toks)


def test_fifo_eviction_and_removed_checkpoints_are_refused(engines: Callable[[str], Engine]) -> None:
    eng = engines("mamba")
    toks = eng.tokenize(TEXT)
    cache = HybridCheckpointCache(eng.ctx, max_checkpoints=3)
    saved: list[HybridCheckpoint] = []
    for i in range(4):
        eng.decode(toks[8 * i : 8 * i + 8], 8 * i)
        with capture_logs() as logs:
            assert cache.save_checkpoint(8 * i + 8, toks)
        saved.append(cache.checkpoints[-1])
    assert [e["pos"] for e in logs if e["event"] == "checkpoint.evict"] == [8]
    assert [cp.pos for cp in cache.checkpoints] == [16, 24, 32]
    assert cache.cache_size == sum(cp.size for cp in cache.checkpoints) == 3 * saved[0].size
    assert cache.find_best_checkpoint(toks[:15]) is None

    evicted = saved[0]
    assert cache.restore_checkpoint(evicted) is False  # evicted: refused, and nothing is invalidated
    assert dataclasses.replace(saved[1]) == saved[1]
    assert cache.restore_checkpoint(dataclasses.replace(saved[1])) is False  # an equal copy is not it
    assert cache.restore_checkpoint(saved[1], seq_id=1) is False  # the wrong sequence
    assert len(cache.checkpoints) == 3

    assert cache.restore_checkpoint(saved[2])  # 24: the one after it (32) is beyond the suffix
    assert [cp.pos for cp in cache.checkpoints] == [16, 24]
    assert cache.restore_checkpoint(saved[3]) is False
    cache.clear()
    assert cache.cache_size == 0 and cache.restore_checkpoint(saved[2]) is False


@pytest.mark.parametrize("max_checkpoints", [0, -1])
def test_disabled_saves_nothing(engines: Callable[[str], Engine], max_checkpoints: int) -> None:
    eng = engines("jamba")
    toks = eng.tokenize(TEXT)
    eng.decode(toks[:10], 0)
    with capture_logs() as logs:
        cache = HybridCheckpointCache(eng.ctx, max_checkpoints=max_checkpoints, verbose=True)
    assert [(e["event"], e["log_level"]) for e in logs] == [("checkpoint.disabled", "info")]
    assert cache.save_checkpoint(10, toks) is False
    assert cache.checkpoints == [] and cache.cache_size == 0
    assert cache.find_best_checkpoint(toks) is None


def test_device_mode_keeps_one_checkpoint_per_sequence(engines: Callable[[str], Engine]) -> None:
    eng = engines("jamba")
    toks = eng.tokenize(TEXT)
    device = HybridCheckpointCache(eng.ctx, on_device=True)
    other_device = HybridCheckpointCache(eng.ctx, on_device=True)
    host = HybridCheckpointCache(eng.ctx)
    eng.decode(toks[:10], 0)
    assert device.save_checkpoint(10, toks) and host.save_checkpoint(10, toks)
    first = device.checkpoints[0]
    eng.decode(toks[10:20], 10)
    assert other_device.save_checkpoint(20, toks)  # overwrites the sequence's device slot
    assert device.checkpoints == [] and device.cache_size == 0
    assert device.restore_checkpoint(first) is False  # stale
    assert len(host.checkpoints) == 1  # host checkpoints own their payload
    assert device.save_checkpoint(20, toks)
    assert other_device.checkpoints == [] and [cp.pos for cp in device.checkpoints] == [20]
    assert device.cache_size == device.checkpoints[0].size < host.cache_size  # only the host-visible part


def test_invalidation_reaches_caches_on_the_same_context(engines: Callable[[str], Engine]) -> None:
    eng, elsewhere = engines("jamba"), engines("jamba")
    toks = eng.tokenize(TEXT)
    a, b = HybridCheckpointCache(eng.ctx), HybridCheckpointCache(eng.ctx)
    c = HybridCheckpointCache(elsewhere.ctx)
    assert set(registered_caches(eng.ctx)) == {a, b} and registered_caches(elsewhere.ctx) == [c]
    elsewhere.decode(toks[:8], 0)
    assert c.save_checkpoint(8, toks)
    for p in (8, 16, 24, 32):
        eng.decode(toks[p - 8 : p], p - 8)
        assert a.save_checkpoint(p, toks) and b.save_checkpoint(p, toks)

    assert a.invalidate_from(23) == 4  # ranges reaching position 23, in both: pos 32 (pos_max 31) and 24 (23)
    assert [cp.pos for cp in a.checkpoints] == [cp.pos for cp in b.checkpoints] == [8, 16]
    assert a.invalidate_from(16, seq_id=1) == 0  # another sequence
    assert b.restore_checkpoint(b.checkpoints[0])  # restoring 8 drops what lies beyond it everywhere
    assert [cp.pos for cp in a.checkpoints] == [8]
    assert a.invalidate_except(0) == 0
    assert b.invalidate_seq(0) == 2 and a.checkpoints == b.checkpoints == []
    assert len(c.checkpoints) == 1  # another context is not touched
    assert c.invalidate_seq() == 1

    assert close_context_caches(eng.ctx) == 2
    assert registered_caches(eng.ctx) == []
    assert a.save_checkpoint(8, toks) is False  # closed
    a.close()  # idempotent


def test_a_failed_restore_invalidates_the_sequence(engines: Callable[[str], Engine]) -> None:
    eng = engines("mamba")
    toks = eng.tokenize(TEXT)
    a, b = HybridCheckpointCache(eng.ctx), HybridCheckpointCache(eng.ctx)
    eng.decode(toks[:10], 0)
    assert a.save_checkpoint(10, toks) and a.save_checkpoint(10, toks, seq_id=0) and b.save_checkpoint(10, toks)
    cp = a.checkpoints[0]
    cp.data = b"\0" * cp.size  # a payload llama.cpp refuses (bad magic)
    with capture_logs() as logs:
        assert a.restore_checkpoint(cp) is False
    assert "checkpoint.restore_failed" in [e["event"] for e in logs]
    assert a.checkpoints == b.checkpoints == []  # the memory may have changed: nothing of seq 0 is trusted


def test_the_registry_holds_weak_references(engines: Callable[[str], Engine]) -> None:
    eng = engines("mamba")
    cache = HybridCheckpointCache(eng.ctx)
    ref = weakref.ref(cache)
    assert registered_caches(eng.ctx) == [cache]
    del cache
    gc.collect()
    assert ref() is None and registered_caches(eng.ctx) == []


def test_close_ctx_none_and_the_disabled_dictionary(engines: Callable[[str], Engine]) -> None:
    with pytest.raises(ValueError):
        HybridCheckpointCache(None)
    eng = engines("mamba")
    toks = eng.tokenize(TEXT)
    eng.decode(toks[:10], 0)
    cache = HybridCheckpointCache(eng.ctx)
    assert cache.max_checkpoints == 16 and cache.on_device is False and cache.verbose is False
    assert cache.save_checkpoint(10, toks)
    cp = cache.checkpoints[0]
    for op in (lambda: cache[toks], lambda: cache.__setitem__(toks, cp), lambda: toks in cache):
        with pytest.raises(NotImplementedError, match="pls use save_checkpoint or restore_checkpoint"):
            op()
    cache.close()
    assert cache._ctx is None and cache._get_size_ext is None and cache.checkpoints == []
    assert cache.restore_checkpoint(cp) is False and cache.find_best_checkpoint(toks) is None
    assert cache not in registered_caches(eng.ctx)
