"""The disk tier's parallel reads (`caches.disk.pread`) and the read paths built on them, model-free.

The CRC-32 combination against zlib, positional reads in pieces, the batch's ordering and stop rules
(sequenced with events, never sleeps), a whole record large enough to be read in pieces, and the blocked
read: a block record that is valid but not this block's, a block row held as bytes in the database, and
the state's buffer going back to the pool as soon as its last view goes (no reference cycle left behind).
"""

from __future__ import annotations

import gc
import os
import random
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from caches.buffers import STATE_BUFFERS
from caches.disk import pread
from caches.disk.format import KIND_STATE, record_size, tokens_to_bytes
from caches.disk.pread import PIECE, Batch, crc32_combine, gather, read_crc
from caches.disk.store import BLK, REC
from caches.disk.tier import DiskTier
from caches.kvstate import MAGIC
from runtime.errors import StateFormatError
from runtime.log import capture_logs
from tests.caches.test_disk_blocks import FP, SETTINGS, agent, digest, payload, tier, whole


def test_crc32_combine_equals_the_crc_of_the_concatenation() -> None:
    rng = random.Random(7)
    for n1, n2 in [(0, 0), (0, 5), (5, 0), (1, 1), (1000, 4096), (PIECE, 3)]:
        a, b, seed = rng.randbytes(n1), rng.randbytes(n2), rng.getrandbits(32)
        assert crc32_combine(zlib.crc32(a, seed), zlib.crc32(b), len(b)) == zlib.crc32(a + b, seed)


def test_read_crc_reads_in_pieces_at_an_offset(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(2 * PIECE + 12_345)
    path = tmp_path / "f"
    path.write_bytes(b"head" + data + b"tail")
    fd = os.open(path, os.O_RDONLY)
    try:
        view = memoryview(bytearray(len(data)))
        assert read_crc(fd, 4, view, 99) == zlib.crc32(data, 99)
        assert bytes(view) == data
        with pytest.raises(StateFormatError) as err:
            read_crc(fd, 4 + PIECE, memoryview(bytearray(len(data))), 0)  # runs past the end
        assert err.value.reason == "truncated"
    finally:
        os.close(fd)


def test_a_batch_raises_the_first_error_in_order_once_every_call_finished() -> None:
    gate, done = threading.Event(), []

    def slow_fail() -> int:
        assert gate.wait(10)
        done.append("slow")
        raise KeyError("first")

    def fail() -> int:
        gate.set()
        done.append("fast")
        raise ValueError("second")

    calls: list[Callable[[], int]] = [slow_fail, fail, lambda: 3]
    with pytest.raises(KeyError):
        gather(calls)
    assert sorted(done) == ["fast", "slow"]
    assert gather([lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]


def test_a_stopped_batch_starts_no_more_calls() -> None:
    ready, stopped, ran = threading.Event(), threading.Event(), []
    holder: list[Batch[None]] = []

    def first() -> None:
        assert ready.wait(10)
        holder[0].stop()  # while call 0 runs, nothing else has started (one helper, the caller not waiting)
        stopped.set()
        ran.append(0)

    calls: list[Callable[[], None]] = [first, *[lambda i=i: ran.append(i) for i in range(1, 50)]]
    holder.append(Batch(calls, helpers=1))
    ready.set()
    assert stopped.wait(10)
    holder[0].abandon()
    assert ran == [0]


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_whole_record_read_in_pieces_round_trips_and_damage_in_a_middle_piece_is_a_miss(
    tmp_path: Path, no_gc: None
) -> None:
    data = random.Random(3).randbytes(3 * PIECE + 1)
    toks = list(range(50))
    with DiskTier(tmp_path, fingerprint=FP, settings=SETTINGS) as t:
        assert t.put(toks, [b"h", data])
        got = t.find(toks)
        assert got is not None and bytes(got[1]) == b"h" + data
        reused = STATE_BUFFERS.reused
        del got  # the buffer goes back at once: nothing else refers to it
        again = t.find(toks)
        assert again is not None and STATE_BUFFERS.reused == reused + 1
        del again
        key = REC + t._digest(tokens_to_bytes(toks))
        (name,) = t._store.cache._sql("SELECT filename FROM Cache WHERE key = ?", (key,)).fetchone()
        path = tmp_path / name
        raw = bytearray(path.read_bytes())
        assert len(raw) == record_size(KIND_STATE, FP, SETTINGS, len(toks), 1 + len(data))
        raw[len(raw) // 2] ^= 0x10
        path.write_bytes(bytes(raw))
        with capture_logs() as logs:
            assert t.find(toks) is None
        assert [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"] == ["checksum"]
        assert len(t) == 0


def _block_file(t: DiskTier, key: bytes) -> str:
    (name,) = t._store.cache._sql("SELECT filename FROM Cache WHERE key = ?", (BLK + key.hex(),)).fetchone()
    return str(name)


def test_a_valid_record_of_another_block_in_a_blocks_place_is_a_miss_said_as_tokens(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        t.put(agent(0), payload(agent(0)))
        keys = t._m.items[digest(t, agent(0))].keys
        second = (tmp_path / _block_file(t, keys[1])).read_bytes()
        (tmp_path / _block_file(t, keys[0])).write_bytes(second)  # same size, its own checksum right
        with capture_logs() as logs:
            assert t.find(agent(0)) is None
        assert [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"] == ["tokens"]
        assert len(t) == 0


def test_a_block_row_held_as_bytes_in_the_database_is_read_too(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        t.put(agent(0), payload(agent(0)))
        t.put(agent(1), payload(agent(1)))
        k = t._m.items[digest(t, agent(0))].keys[2]
        rec = (tmp_path / _block_file(t, k)).read_bytes()
        with t._store.write():
            t._store.put(BLK + k.hex(), rec)  # a small value: kept in the database, not in a file
        assert t._store.cache._sql("SELECT filename FROM Cache WHERE key = ?", (BLK + k.hex(),)).fetchone() == (None,)
        for j in (0, 1):
            got = t.find(agent(j))
            assert got is not None and bytes(got[1]) == whole(agent(j))
        damaged = bytearray(rec)
        damaged[-9] ^= 0x01
        with t._store.write():
            t._store.put(BLK + k.hex(), bytes(damaged))
        with capture_logs() as logs:
            assert t.find(agent(0)) is None
        assert [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"] == ["checksum"] * 2


def _big_kv_state(n: int, layers: int = 2, row: int = 384) -> bytes:
    """A KV sequence state of n cells at positions 0..n-1 (`caches.kvstate`'s layout), random f16 rows."""
    meta = np.zeros((n, 3), dtype=np.int32)
    meta[:, 0], meta[:, 1] = np.arange(n), 1
    rows = np.random.default_rng(n).integers(0, 255, n * row, dtype=np.uint8).tobytes()
    k = b"".join(struct.pack("<iQ", 1, row) + rows for _ in range(layers))
    return struct.pack("<IiII", MAGIC, 0, 1, n) + meta.tobytes() + struct.pack("<II", 0, layers) + k + k


def test_a_blocked_states_buffer_goes_back_to_the_pool_when_its_view_goes(tmp_path: Path, no_gc: None) -> None:
    toks = list(range(1, 1001))
    state = [b"head", _big_kv_state(len(toks))]  # 1.5 MB: a pooled buffer
    with tier(tmp_path) as t:
        t.put(toks, state)
        assert len(t._m.items[digest(t, toks)].keys) == 1000 // 16
        got = t.find(toks)
        assert got is not None and bytes(got[1]) == b"".join(state)
        reused = STATE_BUFFERS.reused
        del got
        again = t.find(toks)
        assert again is not None and STATE_BUFFERS.reused == reused + 1
        assert pread._pool is not None  # its blocks were read on the pool
