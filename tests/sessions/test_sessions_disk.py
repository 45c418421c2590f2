"""DiskStore: persistence, the on-disk format, damaged records and several processes (faults: test_sessions_faults)."""

from __future__ import annotations

import os
import sqlite3
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import diskcache
import msgspec
import pytest

from runtime.log import capture_logs
from sessions import DiskStore, Sampling, Session, SessionCorrupt, SessionNotFound
from sessions.record import HEADER_SIZE, encode_record

ROOT = Path(__file__).resolve().parents[2]


def python(script: str, *args: str) -> subprocess.Popen[bytes]:
    """Start a Python child that can import `sessions`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env)


def raw_set(directory: Path, key: str, value: object) -> None:
    """Write a record behind the store's back."""
    with diskcache.Cache(directory) as cache:
        cache.set(key, value)


def test_reopened_store_shows_the_same_sessions(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        store.create("a", system="sys", sampling=Sampling(seed=4), metadata={"m": [1]})
        store.append_turn("a", "hi", "hello")
        store.create("b")
        store.fork("a", "c", upto=1)
        before = {sid: store.get(sid) for sid in store.list()}
    with DiskStore(tmp_path) as again:
        assert again.list() == ["a", "b", "c"]
        assert {sid: again.get(sid) for sid in again.list()} == before
        assert [(m.role, m.content) for m in again.get("a").messages] == [
            ("user", "hi"),
            ("assistant", "hello"),
        ]


def test_two_stores_on_one_directory_see_each_other(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as one, DiskStore(tmp_path) as two:
        one.create("s")
        two.append_turn("s", "u", "a", expected_revision=0)
        assert one.get("s").revision == 1
        one.delete("s")
        assert not two.exists("s")


def test_records_are_raw_msgpack_in_sqlite_not_pickle(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        store.create("s", metadata={"k": "v"})
        big = store.append_turn("s", "x" * 100_000, "y" * 100_000)  # past diskcache's side-file size
        small = store.create("t")
    with sqlite3.connect(tmp_path / "cache.db") as db:
        rows = db.execute("SELECT key, raw, mode, filename, value FROM Cache ORDER BY key").fetchall()
    assert [(key, raw, mode, filename) for key, raw, mode, filename, _ in rows] == [
        ("s", 1, diskcache.core.MODE_RAW, None),
        ("t", 1, diskcache.core.MODE_RAW, None),
    ]
    assert rows[0][4] == encode_record(big) and rows[0][4][:4] == b"\xc1TS\x01"
    assert rows[1][4] == encode_record(small)
    body = msgspec.msgpack.encode(small)
    assert rows[1][4] == b"\xc1TS\x01" + struct.pack(">II", len(body), zlib.crc32(body)) + body
    assert msgspec.msgpack.decode(rows[0][4][HEADER_SIZE:], type=Session) == big
    assert not any(b"pickle" in value or value[:1] == b"\x80" for *_, value in rows)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("cache.db")) == []


@pytest.mark.parametrize(
    "damage",
    [b"", b"\xc1not msgpack", msgspec.msgpack.encode({"id": "s"}), msgspec.msgpack.encode([1, 2, 3])],
)
def test_damaged_record_raises_session_corrupt(tmp_path: Path, damage: bytes) -> None:
    with DiskStore(tmp_path) as store:
        store.create("s")
        store.create("ok")
        raw_set(tmp_path, "s", damage)
        with capture_logs() as logs, pytest.raises(SessionCorrupt) as info:
            store.get("s")
        assert info.value.session_id == "s"
        assert logs[0]["event"] == "session.corrupt" and logs[0]["session_id"] == "s"
        with pytest.raises(SessionCorrupt):
            store.append_turn("s", "u", "a")
        assert store.list() == ["ok", "s"] and store.exists("s")
        store.import_(store.export("ok"), new_id="s", overwrite=True)
        assert store.get("s").id == "s"
        raw_set(tmp_path, "s", damage)
        store.delete("s")
        with pytest.raises(SessionNotFound):
            store.get("s")


def test_record_under_the_wrong_key_is_corrupt(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        other = store.create("other")
        raw_set(tmp_path, "s", msgspec.msgpack.encode(other))
        with pytest.raises(SessionCorrupt, match="holds session 'other'"):
            store.get("s")
        raw_set(tmp_path, "p", 12345)  # stored, but not as bytes
        with pytest.raises(SessionCorrupt, match="not msgpack bytes"):
            store.get("p")


APPENDER = """
    import sys
    from sessions import DiskStore
    store = DiskStore(sys.argv[1])
    for i in range(int(sys.argv[3])):
        store.append_turn("shared", f"{sys.argv[2]}u{i}", f"{sys.argv[2]}a{i}")
"""


def test_processes_appending_to_one_session_lose_nothing(tmp_path: Path) -> None:
    DiskStore(tmp_path).create("shared")
    children = [python(APPENDER, str(tmp_path), tag, "40") for tag in ("p", "q", "r")]
    assert [child.wait(timeout=60) for child in children] == [0, 0, 0]
    with DiskStore(tmp_path) as store:
        s = store.get("shared")
    assert s.revision == 120
    pairs = [(s.messages[i], s.messages[i + 1]) for i in range(0, len(s.messages), 2)]
    assert all(u.role == "user" and a.role == "assistant" for u, a in pairs)
    assert all(u.content.replace("u", "a") == a.content for u, a in pairs)
    for tag in ("p", "q", "r"):
        assert [u.content for u, _ in pairs if u.content[0] == tag] == [f"{tag}u{i}" for i in range(40)]
