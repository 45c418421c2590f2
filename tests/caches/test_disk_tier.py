"""The disk tier (`caches.DiskTier`) on a real diskcache directory."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import diskcache
import pytest

from caches.disk.format import KIND_INDEX, KIND_STATE, PartsReader, StateFormatError, decode, encode
from caches.disk.tier import DiskTier, DiskTierStats
from runtime.log import capture_logs

FP = "model-sha256:0123abcd"
SETTINGS = "n_ctx=8192;type_k=f16;type_v=f16"


def payload(seed: int, size: int = 64 << 10) -> bytes:
    """Deterministic bytes, large enough (>= 32 KiB) that diskcache keeps them in a file."""
    return (seed.to_bytes(4, "little") * (size // 4 + 1))[:size]


def toks(a: int, b: int) -> list[int]:
    return list(range(a, b))


def tier(path: Path, **kw: object) -> DiskTier:
    args: dict[str, object] = {"fingerprint": FP, "settings": SETTINGS, **kw}
    return DiskTier(path, **args)  # type: ignore[arg-type]


def val_files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.val"))


def rejections(logs: Sequence[Mapping[str, Any]]) -> list[object]:
    return [e["reason"] for e in logs if e["event"] == "disk_tier.rejected"]


def test_round_trip(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        a, b = toks(0, 100), [*toks(0, 10), *toks(500, 540)]
        assert t.put(a, payload(1)) is True
        assert t.put(b, payload(2, 1000)) is True
        assert len(t) == 2
        assert t.find(a) == (a, payload(1))
        assert t.find([*a, 7, 8, 9]) == (a, payload(1))  # a longer prompt
        assert t.find(toks(0, 60)) == (a, payload(1))  # keeps 60 of 100
        assert t.find(toks(0, 25)) == (a, payload(1))  # keeps exactly a quarter
        assert t.find(toks(0, 24)) is None  # keeps 24/100 of a, 10/50 of b: under a quarter
        assert t.find([*toks(0, 10), *toks(500, 520)]) == (b, payload(2, 1000))  # b keeps 30, a 10
        assert t.find(toks(0, 60), better_than=60) is None  # not more than the slot already has
        assert t.find(toks(0, 60), better_than=59) is not None
        assert t.find(toks(9000, 9100)) is None
        assert t.find([]) is None
        s = t.stats()
        assert (s.entries, s.puts, s.hits, s.misses, s.evictions, s.rejected) == (2, 2, 6, 4, 0, 0)
        assert s.bytes == t.nbytes == s.bytes_written
        assert s.bytes_read == 5 * (len(payload(1)) + 26 + len(FP) + len(SETTINGS) + 400 + 4) + (
            1000 + 26 + len(FP) + len(SETTINGS) + 200 + 4
        )
        with pytest.raises(AttributeError, match="immutable"):  # a frozen msgspec Struct
            s.hits = 0  # type: ignore[misc]
        assert isinstance(s, DiskTierStats)


def test_the_best_entry_keeps_the_most(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        t.put(toks(0, 40), payload(40, 100))
        t.put([*toks(0, 30), *toks(700, 710)], payload(30, 100))
        t.put([*toks(0, 30), *toks(800, 840)], payload(31, 100))
        prompt = [*toks(0, 35), 1]
        assert t.find(prompt) == (toks(0, 40), payload(40, 100))  # keeps 35
        assert t.remove(toks(0, 40)) is True
        assert t.remove(toks(0, 40)) is False
        # 30 kept by both: the shorter one (the larger kept fraction) wins.
        assert t.find(prompt) == ([*toks(0, 30), *toks(700, 710)], payload(30, 100))


def test_put_replaces_same_tokens_and_drops_prefixes(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        t.put(toks(0, 10), payload(1, 100))
        t.put(toks(0, 20), payload(2, 100))  # holds the first whole: it goes
        t.put(toks(100, 120), payload(3, 100))
        t.put(toks(100, 110), payload(4, 100))  # a prefix of a stored entry: both stay
        assert len(t) == 3
        assert t.find(toks(100, 110)) == (toks(100, 110), payload(4, 100))
        t.put(toks(100, 120), payload(5, 200))  # the same tokens: replaced; holds 100..110 whole
        assert len(t) == 2
        assert t.find(toks(0, 10)) == (toks(0, 20), payload(2, 100))
        assert t.find(toks(100, 120)) == (toks(100, 120), payload(5, 200))
        assert t.find(toks(100, 110)) == (toks(100, 120), payload(5, 200))
        assert t.stats().replaced == 2
        assert t.put([], b"x") is False


def test_a_failed_write_is_logged_and_changes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with tier(tmp_path) as t:
        t.put(toks(0, 10), payload(1))
        set_ = t._store.cache.set

        def full(key: str, value: object, **kw: object) -> object:
            if key.startswith("turnstile:r:"):
                raise OSError(28, "No space left on device")
            return set_(key, value, **kw)

        monkeypatch.setattr(t._store.cache, "set", full)
        with capture_logs() as logs:
            assert t.put(toks(0, 20), payload(2)) is False  # would have replaced 0..10
        assert [e["event"] for e in logs] == ["disk_tier.write_failed"]
        monkeypatch.undo()
        assert len(t) == 1
        assert t.find(toks(0, 10)) == (toks(0, 10), payload(1))
        assert t.stats().puts == 1
    assert len(val_files(tmp_path)) == 1


def test_a_second_tier_on_the_same_dir_finds_entries(tmp_path: Path) -> None:
    t = tier(tmp_path)
    t.put(toks(0, 50), payload(7))
    t.close()
    with tier(tmp_path) as again:
        assert len(again) == 1
        assert again.find(toks(0, 60)) == (toks(0, 50), payload(7))
        assert again.stats().hits == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "version", "delete"])
def test_a_damaged_record_is_a_miss_logged_and_removed(tmp_path: Path, damage: str) -> None:
    with tier(tmp_path) as t:
        t.put(toks(0, 50), payload(7))
    (path,) = val_files(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        del data[len(data) // 2 :]
    elif damage == "version":
        data[4:6] = (2).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    if damage == "delete":
        path.unlink()
    with tier(tmp_path) as t, capture_logs() as logs:
        assert t.find(toks(0, 50)) is None
        assert len(t) == 0
        s = t.stats()
        assert (s.rejected, s.misses, s.hits) == (1, 1, 0)
    reasons = {"flip": "checksum", "truncate": "truncated", "version": "version", "delete": "missing"}
    assert rejections(logs) == [reasons[damage]]
    assert [e["log_level"] for e in logs if e["event"] == "disk_tier.rejected"] == ["warning"]
    assert val_files(tmp_path) == []
    with tier(tmp_path) as t:
        assert len(t) == 0


@pytest.mark.parametrize(
    ("other", "reason"),
    [({"fingerprint": "another-model"}, "fingerprint"), ({"settings": "n_ctx=4096;type_k=q8_0"}, "settings")],
)
def test_another_models_entry_is_a_miss_logged_and_removed(tmp_path: Path, other: dict[str, str], reason: str) -> None:
    with tier(tmp_path) as t:
        t.put(toks(0, 50), payload(7))
    with capture_logs() as logs, tier(tmp_path, **other) as t:
        assert t.find(toks(0, 50)) is None
        assert t.stats().rejected == 1
    assert rejections(logs) == [reason]
    with tier(tmp_path) as t:  # the original model's tier no longer has it either
        assert len(t) == 0
        assert t.find(toks(0, 50)) is None
    assert val_files(tmp_path) == []


def test_a_damaged_index_record_is_rejected(tmp_path: Path) -> None:
    with tier(tmp_path) as t:
        t.put(toks(0, 50), payload(7))
    with diskcache.Cache(str(tmp_path)) as raw:
        (key,) = [k for k in raw.iterkeys() if k.startswith("turnstile:i:")]
        record = bytearray(raw[key])
        record[-1] ^= 1
        raw[key] = bytes(record)
    with capture_logs() as logs, tier(tmp_path) as t:
        assert len(t) == 0
    assert rejections(logs) == ["checksum"]


def test_the_byte_limit_holds_after_100_inserts(tmp_path: Path) -> None:
    limit = 1 << 20
    with tier(tmp_path, limit_bytes=limit) as t:
        for i in range(100):
            assert t.put(toks(1000 * i, 1000 * i + 50), payload(i, (40 + i % 7 * 9) << 10)) is True
            assert t.nbytes <= limit
        s = t.stats()
        assert s.bytes <= limit
        assert s.evictions == 100 - s.entries
        assert 10 <= s.entries < 100
        assert sum(p.stat().st_size for p in val_files(tmp_path)) <= limit
        assert len(val_files(tmp_path)) == s.entries
        # The newest survive, the oldest went.
        assert t.find(toks(99_000, 99_050)) is not None
        assert t.find(toks(0, 50)) is None
        assert t.put(toks(0, 10), payload(0, limit)) is False  # larger than the limit alone


def test_eviction_is_least_recently_used_across_restarts(tmp_path: Path) -> None:
    size = 100 << 10
    with tier(tmp_path, limit_bytes=3 * size + 3000) as t:
        for name in range(3):
            t.put(toks(100 * name, 100 * name + 10), payload(name, size))
    with tier(tmp_path, limit_bytes=3 * size + 3000) as t:
        assert t.find(toks(0, 10)) is not None  # entry 0 used: entry 1 is now the least recent
        t.put(toks(300, 310), payload(3, size))
        assert t.stats().evictions == 1
        assert t.find(toks(100, 110)) is None
        assert t.find(toks(0, 10)) is not None
        assert t.find(toks(200, 210)) is not None


def test_two_threads_lose_nothing(tmp_path: Path) -> None:
    shared = tier(tmp_path)
    other = tier(tmp_path)  # a second object on the same directory
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def work(t: DiskTier, base: int) -> None:
        try:
            start.wait()
            for i in range(15):
                tokens = toks(base + 100 * i, base + 100 * i + 20)
                assert t.put(tokens, payload(base + i, (1 + i % 3) * 20_000))
                assert t.find(tokens) == (tokens, payload(base + i, (1 + i % 3) * 20_000))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=args) for args in [(shared, 0), (shared, 10_000), (other, 20_000)]]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    for t in (shared, other):
        assert len(t) == 45
        for base in (0, 10_000, 20_000):
            for i in range(15):
                tokens = toks(base + 100 * i, base + 100 * i + 20)
                assert t.find(tokens) == (tokens, payload(base + i, (1 + i % 3) * 20_000))
    shared.close()
    other.close()


_WRITER = """
import sys
from caches.disk.tier import DiskTier
base = int(sys.argv[2])
with DiskTier(sys.argv[1], fingerprint=sys.argv[3], settings=sys.argv[4]) as t:
    for i in range(15):
        assert t.put(list(range(base + 100 * i, base + 100 * i + 20)), bytes([i]) * 40_000)
"""


def test_two_processes_lose_nothing(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(base), FP, SETTINGS], cwd=root, stdout=subprocess.DEVNULL
        )
        for base in (0, 50_000)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    with tier(tmp_path) as t:
        assert len(t) == 30
        for base in (0, 50_000):
            for i in range(15):
                tokens = toks(base + 100 * i, base + 100 * i + 20)
                assert t.find(tokens) == (tokens, bytes([i]) * 40_000)


def test_record_format_round_trip_and_checks() -> None:
    import io

    rec = encode(KIND_STATE, FP, SETTINGS, [1, -2, 3], b"payload")
    assert rec[:4] == b"TSKV"
    got = decode(io.BytesIO(rec), len(rec), kind=KIND_STATE, fingerprint=FP, settings=SETTINGS)
    assert (got.tokens, got.payload) == ((1, -2, 3), b"payload")
    reader = PartsReader([b"ab", b"", memoryview(b"cdef")])
    assert [bytes(reader.read(3)) for _ in range(4)] == [b"ab", b"cde", b"f", b""]
    index = encode(KIND_INDEX, FP, SETTINGS, [1, 2], payload_len=123)
    got = decode(io.BytesIO(index), len(index), kind=KIND_INDEX, fingerprint=FP, settings=SETTINGS)
    assert (got.tokens, got.payload_len, got.payload) == ((1, 2), 123, b"")
    cases: dict[str, tuple[bytes, dict[str, object]]] = {
        "kind": (index, {}),
        "truncated": (rec[:-1], {}),
        "length": (rec + b"\0", {}),
        "magic": (b"XXXX" + rec[4:], {}),
        "fingerprint": (rec, {"fingerprint": "other"}),
        "settings": (rec, {"settings": ""}),
        "tokens": (rec, {"tokens": [1, 2, 4]}),
    }
    for reason, (data, kw) in cases.items():
        args: dict[str, object] = {"kind": KIND_STATE, "fingerprint": FP, "settings": SETTINGS, **kw}
        with pytest.raises(StateFormatError) as err:
            decode(io.BytesIO(data), len(data), **args)  # type: ignore[arg-type]
        assert err.value.reason == reason


def test_limit_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        tier(tmp_path, limit_bytes=-1)
    assert not os.listdir(tmp_path)
