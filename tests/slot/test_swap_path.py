"""The swap path copies a state once each way: engine buffer views, the SlotState disk layout, the disk tier."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest

from caches.buffers import STATE_BUFFERS, BufferPool
from caches.disk.format import KIND_INDEX, KIND_STATE, Buffer, decode, encode, record_size
from caches.disk.tier import DiskTier
from runtime.llama.engine import Engine
from runtime.slot.executor import _StateCodec
from runtime.slot.state import MAGIC, Checkpoint, SlotState, StateFormatError

FP = "fp-swap"
SETTINGS = "n_ctx=1024"
PROMPT = "<|im_start|>user\nhello world, tell me a story about the sea<|im_end|>\n<|im_start|>assistant\n"


def _state(n: int = 1000, cps: int = 2) -> SlotState:
    rng = np.random.default_rng(n)
    return SlotState(
        rng.integers(0, 256, n, dtype=np.uint8).tobytes(),
        tuple(Checkpoint(10 * i, i, 9 * i, bytes([i]) * (7 + i), request_id=100 + i) for i in range(cps)),
    )


def test_state_get_is_a_read_only_view_and_state_set_takes_any_buffer(
    tiny_llama: Path, make_engine: Callable[..., Engine]
) -> None:
    eng = make_engine(tiny_llama)
    a = eng.tokenize(PROMPT)
    eng.clear()
    eng.decode(a, 0)
    saved = eng.state_get()
    assert isinstance(saved, memoryview) and saved.readonly and saved.format == "B"
    assert len(saved) == eng.state_size() > 0
    cont = eng.tokenize(" more about the moon", add_special=False)
    eng.decode(cont, len(a))
    expected = eng.logits()
    for data in (saved, bytes(saved), bytearray(saved), memoryview(bytes(saved))[0:]):
        eng.clear()
        eng.decode(eng.tokenize("something else"), 0)
        assert eng.state_set(data)
        assert eng.pos_max() == len(a) - 1
        assert bytes(eng.state_get()) == bytes(saved)
        eng.decode(cont, len(a))
        np.testing.assert_array_equal(eng.logits(), expected)
    assert eng.state_set(bytes(saved[:-10])) is False  # llama.cpp refuses a cut state: memory cleared
    assert eng.pos_max() == -1


def test_layout_round_trip_gives_views_into_the_buffer() -> None:
    st = _state()
    parts = st.parts()
    assert parts[1] is st.state and [p for p in parts[2:]] == [c.data for c in st.checkpoints]  # not copied
    blob = bytearray(b"".join(parts))
    assert blob[:4] == MAGIC and st.encode() == bytes(blob)
    back = SlotState.from_buffer(blob)
    assert back == st
    assert back.nbytes == st.nbytes == 1000 + 7 + 8
    assert isinstance(back.state, memoryview) and back.state.obj is blob  # a view, no copy
    blob[len(parts[0])] ^= 0xFF
    assert bytes(back.state[:1]) != bytes(st.state[:1])  # it sees the buffer change
    assert SlotState.decode(st.encode()) == st
    empty = SlotState(b"")
    assert SlotState.from_buffer(empty.encode()) == empty


def test_earlier_msgpack_states_are_still_read() -> None:
    st = _state(300, 3)
    old = {
        "state": st.state,
        "checkpoints": [
            {"n_tokens": c.n_tokens, "pos_min": c.pos_min, "pos_max": c.pos_max, "data": c.data, "request_id": 7}
            for c in st.checkpoints
        ],
    }
    back = _StateCodec.decode(memoryview(msgspec.msgpack.encode(old)))
    assert back.state == st.state
    assert [(c.n_tokens, c.pos_min, c.pos_max, bytes(c.data), c.request_id) for c in back.checkpoints] == [
        (c.n_tokens, c.pos_min, c.pos_max, bytes(c.data), 7) for c in st.checkpoints
    ]


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda b: b[:10], "truncated header"),
        (lambda b: b"XXXX" + b[4:], "neither layout"),
        (lambda b: b[:4] + b"\x02\x00" + b[6:], "layout 2"),
        (lambda b: b[:-1], "do not add up"),
        (lambda b: b + b"\0", "do not add up"),
        (lambda b: b[:8] + (10**6).to_bytes(4, "little") + b[12:], "truncated checkpoint table"),
    ],
)
def test_bad_layouts_are_refused(mangle: Callable[[bytes], bytes], message: str) -> None:
    with pytest.raises(StateFormatError, match=message) as err:
        SlotState.decode(mangle(_state().encode()))
    assert isinstance(err.value, ValueError)  # the tiered cache treats it as an undecodable entry


def test_disk_tier_writes_parts_and_reads_into_one_buffer(tmp_path: Path) -> None:
    st = _state(300_000, 2)
    toks = list(range(40))
    with DiskTier(tmp_path, fingerprint=FP, settings=SETTINGS) as t:
        assert t.put(toks, st.parts()) is True
        plen = len(st.encode())
        assert t.stats().bytes_written == record_size(KIND_STATE, FP, SETTINGS, 40, plen) + record_size(
            KIND_INDEX, FP, SETTINGS, 40, plen
        )
        found = t.find(toks)
        assert found is not None
        got_toks, payload = found
        assert got_toks == toks and isinstance(payload, memoryview) and payload.readonly
        assert payload == st.encode()
        back = _StateCodec.decode(payload)
        assert back == st and isinstance(back.state, memoryview)
        assert back.state.obj is payload.obj  # the state is a view of the buffer the record was read into
        assert t.put(toks[:10], [b"ab", memoryview(b"cd"), bytearray(b"e")]) is True
        small = t.find(toks[:10])
        assert small is not None and (small[0], bytes(small[1])) == (toks[:10], b"abcde")


def test_record_payload_parts_and_chunked_read() -> None:
    parts: list[Buffer] = [b"abc", memoryview(bytearray(b"defg")), np.arange(4, dtype=np.int32).data]
    whole = b"abcdefg" + np.arange(4, dtype=np.int32).tobytes()
    rec = encode(KIND_STATE, FP, SETTINGS, [1, 2], parts)
    assert rec == encode(KIND_STATE, FP, SETTINGS, [1, 2], whole)
    got = decode(io.BytesIO(rec), len(rec), kind=KIND_STATE, fingerprint=FP, settings=SETTINGS)
    assert got.payload == whole and got.payload.readonly and got.payload_len == len(whole)


def test_pool_reuses_a_buffer_only_when_nothing_refers_to_it() -> None:
    pool = BufferPool(keep=2, min_pooled=1 << 20)
    a = pool.take(2 << 20)
    assert (len(a), a.readonly, a.format) == (2 << 20, False, "B")
    a[:3] = b"abc"
    tail = a.toreadonly()[1:]  # a view of a view still holds the buffer
    del a
    b = pool.take(2 << 20)
    assert (pool.allocated, pool.reused) == (2, 0)
    arr = np.frombuffer(tail, dtype=np.uint8)
    del tail
    c = pool.take(2 << 20)
    assert (pool.allocated, pool.reused) == (3, 0)
    del arr
    d = pool.take((2 << 20) - 100)  # fits within the slack: the first buffer's memory, uninitialised
    assert (pool.allocated, pool.reused) == (3, 1)
    assert (len(d), bytes(d[:3])) == ((2 << 20) - 100, b"abc")  # the same memory, not cleared
    assert pool.take(1 << 10) is not None and pool.allocated == 3  # small: a plain allocation
    big = pool.take(4 << 20)  # no free buffer fits
    assert pool.allocated == 4
    del b, c, d, big
    assert pool.idle_bytes() == 10 << 20
    held = pool.take(16 << 20)  # keeps two free buffers, the most recently used: d's (2 MiB) and big's (4 MiB)
    assert pool.idle_bytes() == 6 << 20 and len(held) == 16 << 20


def test_state_get_reuses_the_memory_of_a_dropped_state(
    tiny_llama: Path, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = make_engine(tiny_llama)
    eng.clear()
    eng.decode(eng.tokenize(PROMPT), 0)
    monkeypatch.setattr(STATE_BUFFERS, "min_pooled", 1)  # the tiny model's state is small

    def address(view: memoryview) -> int:
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)

    first = eng.state_get()
    second = eng.state_get()
    assert second == first and address(second) != address(first)  # `first` is still referred to
    where, reused = address(first), STATE_BUFFERS.reused
    del first
    third = eng.state_get()
    assert third == second and address(third) == where and STATE_BUFFERS.reused == reused + 1


def test_swap_benchmark_runs_and_writes_json(tiny_llama: Path, tmp_path: Path) -> None:
    import json

    from benchmarks import swap

    swap.main(["--model", str(tiny_llama), "--tokens", "64", "--n-ctx", "256", "--repeat", "2", "--threads", "1",
               "--dir", str(tmp_path), "--out", str(tmp_path)])  # fmt: skip
    doc = json.loads((tmp_path / "swap.json").read_text())
    ops = [r["operation"] for r in doc["rows"]]
    assert ops[:5] == ["memcpy (fresh memory)", "memcpy (into mapped memory)", "save, fresh memory", "save (state_get)",
                       "restore (state_set)"]  # fmt: skip
    assert {"disk write", "disk read", "disk read + restore"} <= set(ops)
    assert all(r["median_ms"] >= 0 and set(swap.COLUMNS) <= r.keys() for r in doc["rows"])
    assert doc["params"]["state_bytes"] > 0
    assert doc["params"]["tokens"] == 64
