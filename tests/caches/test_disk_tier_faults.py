"""The disk tier under faults: pickled rows, unusable directories, damaged databases, full disks, limits."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache
import pytest

import caches.disk.tier as disk_tier_module
from caches.disk.format import PartsReader
from caches.disk.tier import DiskTier
from runtime.errors import DiskTierUnavailable, TurnstileError
from runtime.log import capture_logs

FP = "model-sha256:0123abcd"
SETTINGS = "n_ctx=8192"


def payload(seed: int, size: int = 64 << 10) -> bytes:
    return (seed.to_bytes(4, "little") * (size // 4 + 1))[:size]


def toks(a: int, b: int) -> list[int]:
    return list(range(a, b))


def tier(path: Path, **kw: Any) -> DiskTier:
    return DiskTier(path, fingerprint=FP, settings=SETTINGS, **kw)


def val_files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.val"))


class Planted:
    """Unpickling this touches a marker file: the proof that a pickled row was (or was not) loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return pathlib.Path.touch, (self.marker,)


def digest_of(t: DiskTier, tokens: list[int]) -> str:
    from caches.disk.format import tokens_to_bytes

    return t._digest(tokens_to_bytes(tokens))


@pytest.mark.parametrize("row", ["i", "u", "r", "stray"])
def test_a_pickled_row_is_refused_logged_and_removed_never_loaded(tmp_path: Path, row: str) -> None:
    kept = toks(0, 50)
    with tier(tmp_path) as t:
        assert t.put(kept, payload(7)) is True
        d = digest_of(t, kept)
    marker = tmp_path.parent / f"{tmp_path.name}-unpickled"
    key = f"turnstile:{row}:{d}" if row != "stray" else "turnstile:i:" + "f" * 40
    with diskcache.Cache(str(tmp_path)) as raw:  # plain diskcache pickles what is not bytes/str/int
        raw.set(key, Planted(marker))
    with capture_logs() as logs, tier(tmp_path) as t:
        got = t.find(toks(0, 60))
        n = len(t)
    assert not marker.exists()
    rejected = [(e["reason"], e["key"]) for e in logs if e["event"] == "disk_tier.rejected"]
    if row == "stray":
        assert got == (kept, payload(7))
        assert rejected == [("unsafe", "f" * 40)]
        assert n == 1
    else:
        assert got is None
        assert rejected == [("unsafe", d)]
        assert n == 0
        assert val_files(tmp_path) == []
    with diskcache.Cache(str(tmp_path)) as raw:
        assert key not in raw


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make `path` read-only: a read-only bind mount as root (permissions do not stop root), else chmod."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    if subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount (needed to make a directory read-only as root)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only")
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


@pytest.mark.parametrize("existing", [False, True])
def test_a_read_only_directory_is_unavailable(tmp_path: Path, existing: bool) -> None:
    states = tmp_path / "states"
    states.mkdir()
    if existing:
        with tier(states) as t:
            t.put(toks(0, 10), payload(1))
    with read_only(states), pytest.raises(DiskTierUnavailable) as err:
        tier(states)
    assert isinstance(err.value, TurnstileError)
    assert err.value.directory == str(states)
    assert "OperationalError" in err.value.reason


def test_a_file_in_place_of_the_directory_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "states"
    path.write_bytes(b"not a directory")
    with pytest.raises(DiskTierUnavailable):
        tier(path)


@pytest.mark.parametrize("damage", ["garbage", "pages"])
def test_a_damaged_cache_db_is_unavailable(tmp_path: Path, damage: str) -> None:
    with tier(tmp_path) as t:
        for i in range(40):
            t.put(toks(100 * i, 100 * i + 30), payload(i, 2000))
    db = tmp_path / "cache.db"
    data = bytearray(db.read_bytes())
    if damage == "garbage":
        data[:] = b"this is not an SQLite database " * 200
    else:  # keep the header page, overwrite the rest
        data[4096:] = bytes([0xA5]) * (len(data) - 4096)
    db.write_bytes(bytes(data))
    with pytest.raises(DiskTierUnavailable) as err:
        tier(tmp_path)
    assert "DatabaseError" in err.value.reason


class _FailingReader(PartsReader):
    """Gives the first two chunks, then fails as a full disk does."""

    def __init__(self, parts: Any) -> None:
        super().__init__(parts)
        self.calls = 0

    def read(self, n: int = -1) -> bytes | memoryview:
        self.calls += 1
        if self.calls > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().read(n)


def test_a_write_failing_midway_removes_its_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tier(tmp_path) as t:
        assert t.put(toks(0, 10), payload(1)) is True
        before = t.stats()
        monkeypatch.setattr(disk_tier_module, "PartsReader", _FailingReader)
        with capture_logs() as logs:
            assert t.put(toks(0, 20), payload(2, 6 << 20)) is False  # would have replaced 0..10
        monkeypatch.undo()
        assert [e["event"] for e in logs] == ["disk_tier.write_failed"]
        assert len(val_files(tmp_path)) == 1
        after = t.stats()
        assert (after.entries, after.bytes, after.puts) == (1, before.bytes, 1)
        assert t.find(toks(0, 10)) == (toks(0, 10), payload(1))
        assert t.put(toks(50, 60), payload(3)) is True
        assert len(val_files(tmp_path)) == 2
        assert t.nbytes == t.stats().bytes == 2 * before.bytes
    with tier(tmp_path) as again:
        assert again.nbytes == 2 * before.bytes


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_full_disk_leaves_no_partial_file_and_the_accounting_right(tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "full", "1m") as path, tier(path, limit_bytes=0) as t:
        assert t.put(toks(0, 10), payload(1, 100 << 10)) is True
        one = t.nbytes
        with capture_logs() as logs:
            assert t.put(toks(100, 110), payload(2, 2 << 20)) is False
        assert [e["event"] for e in logs] == ["disk_tier.write_failed"]
        assert len(val_files(path)) == 1
        assert (len(t), t.nbytes) == (1, one)
        assert t.find(toks(0, 10)) == (toks(0, 10), payload(1, 100 << 10))
        assert t.put(toks(200, 210), payload(3, 100 << 10)) is True
        assert (len(t), len(val_files(path))) == (2, 2)


def test_a_database_error_during_a_put_is_a_logged_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tier(tmp_path) as t:
        assert t.put(toks(0, 10), payload(1)) is True
        cache = t._store.cache
        set_ = cache.set

        def full(key: str, value: object, **kw: object) -> object:
            if key.startswith("turnstile:"):
                raise sqlite3.OperationalError("database or disk is full")
            return set_(key, value, **kw)

        monkeypatch.setattr(cache, "set", full)
        with capture_logs() as logs:
            assert t.put(toks(100, 110), payload(2)) is False
            assert t.find(toks(0, 10)) is None  # its touch fails too: a logged miss
        monkeypatch.undo()
        assert [e["event"] for e in logs] == ["disk_tier.write_failed", "disk_tier.read_failed"]
        assert len(t) == 1
        assert len(val_files(tmp_path)) == 1
        assert t.find(toks(0, 10)) == (toks(0, 10), payload(1))


def test_reopening_with_a_lower_limit_evicts_down_to_it(tmp_path: Path) -> None:
    with tier(tmp_path, limit_bytes=0) as t:
        for i in range(5):
            assert t.put(toks(100 * i, 100 * i + 10), payload(i, 100 << 10)) is True
        one = t.nbytes // 5
        assert t.find(toks(0, 10)) is not None  # entry 0 is now the most recently used
    with capture_logs() as logs, tier(tmp_path, limit_bytes=2 * one + one // 2) as t:
        assert len(t) == 2
        assert t.nbytes == 2 * one
        assert t.stats().evictions == 3
        assert t.find(toks(0, 10)) is not None
        assert t.find(toks(400, 410)) is not None
    assert [e["event"] for e in logs].count("disk_tier.evicted") == 3
    assert len(val_files(tmp_path)) == 2


_KILLED_WRITER = """
import os, signal, sys
import caches.disk.tier as m
from caches.disk.format import PartsReader

class Dies(PartsReader):
    def read(self, n=-1):
        chunk = super().read(n)
        if not chunk:
            os.kill(os.getpid(), signal.SIGKILL)  # the file is written, its row not committed
        return chunk

t = m.DiskTier(sys.argv[1], fingerprint=sys.argv[2], settings=sys.argv[3])
m.PartsReader = Dies
t.put(list(range(500, 520)), bytes(100_000))
"""


def test_a_writer_killed_mid_put_leaves_no_file_after_reopening(tmp_path: Path) -> None:
    import sys

    with tier(tmp_path) as t:
        assert t.put(toks(0, 10), payload(1)) is True
        one = t.nbytes
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path), FP, SETTINGS], cwd=root)
    assert proc.returncode == -9
    assert len(val_files(tmp_path)) == 2  # the dead writer's file, no row
    with capture_logs() as logs, tier(tmp_path) as t:
        assert (len(t), t.nbytes) == (1, one)
        assert t.find(toks(0, 10)) == (toks(0, 10), payload(1))
    assert [e["count"] for e in logs if e["event"] == "disk_tier.orphan_files_removed"] == [1]
    assert len(val_files(tmp_path)) == 1


def test_a_pickled_change_log_row_is_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path.parent / f"{tmp_path.name}-unpickled"
    with tier(tmp_path) as t:
        assert t.put(toks(0, 50), payload(7)) is True
        with diskcache.Cache(str(tmp_path)) as raw:  # as if another writer had committed change 2
            assert raw["turnstile-meta:seq"] == 1
            raw.set("turnstile-meta:log:2", Planted(marker))
            raw.set("turnstile-meta:seq", 2)
        assert t.find(toks(0, 60)) == (toks(0, 50), payload(7))  # the tier reloads instead
        assert len(t) == 1
    assert not marker.exists()
    with diskcache.Cache(str(tmp_path)) as raw:
        assert "turnstile-meta:log:2" not in raw
