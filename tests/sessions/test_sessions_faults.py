"""DiskStore under faults: planted pickles, flipped bits, old records, unusable directories, SIGKILL.

Damage is planted behind the store's back (plain diskcache, sqlite3, raw bytes) and the store must
refuse it with a typed error that names what is wrong, leave everything else readable and change
nothing. The SIGKILL test kills a writer process at random points, sequenced by its acks on a pipe.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import diskcache
import msgspec
import pytest

from runtime.errors import StoreUnavailable
from runtime.log import capture_logs
from sessions import DiskStore, Message, Sampling, Session, SessionCorrupt, SessionNotFound
from sessions.base import StoreBase
from sessions.record import HEADER_SIZE, MAGIC, decode_record, encode_record

ROOT = Path(__file__).resolve().parents[2]

# A record written by the previous format (plain msgpack, no header), verbatim from a store made
# before the checksum: session "legacy", system "be brief", seed 7, metadata {"tag": ["old"]}, one turn.
LEGACY_RECORD = bytes.fromhex(
    "88a26964a66c6567616379a673797374656da86265206272696566a86d657373616765739283a4726f6c65a475736572"
    "a7636f6e74656e74a568656c6c6fa763726561746564cb41d954fc4080000083a4726f6c65a9617373697374616e74a7"
    "636f6e74656e74a86869207468657265a763726561746564cb41d954fc40800000a873616d706c696e678cab74656d70"
    "65726174757265cb3fe999999999999aa5746f705f6b28a5746f705f70cb3fee666666666666a56d696e5f70cb3fa999"
    "999999999aae7265706561745f70656e616c7479cb3ff0000000000000ad7265706561745f6c6173745f6e40b0707265"
    "73656e63655f70656e616c7479cb0000000000000000b16672657175656e63795f70656e616c7479cb00000000000000"
    "00a47365656407aa6d61785f746f6b656e73c0a473746f7090aa69676e6f72655f656f73c2a86d6574616461746181a3"
    "74616791a36f6c64a763726561746564cb41d954fc40400000a775706461746564cb41d954fc40800000a87265766973"
    "696f6e01"
)


class Boom:
    """Unpickling this makes the directory `marker`: proof that something was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return os.mkdir, (str(self.marker),)


def plant(directory: Path, key: Any, value: Any) -> None:
    """Write a row with plain diskcache, which pickles what is not str/bytes/int/float."""
    with diskcache.Cache(directory) as cache:
        cache.set(key, value)


def rows(directory: Path) -> dict[str, bytes]:
    with sqlite3.connect(directory / "cache.db") as db:
        return dict(db.execute("SELECT key, value FROM Cache WHERE raw = 1").fetchall())


def set_row(directory: Path, key: str, value: bytes) -> None:
    with sqlite3.connect(directory / "cache.db") as db:
        assert db.execute("UPDATE Cache SET value = ? WHERE key = ?", (value, key)).rowcount == 1


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# --- never unpickle -------------------------------------------------------------------------------


def test_a_pickled_row_is_corrupt_and_never_unpickled(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        ok = store.create("ok", system="fine")
        store.create("s")
    marker = tmp_path.parent / f"{tmp_path.name}-unpickled"
    plant(tmp_path, "s", Boom(marker))
    plant(tmp_path, "d", {"id": "d"})
    with DiskStore(tmp_path) as store:
        for sid in ("s", "d"):
            with capture_logs() as logs, pytest.raises(SessionCorrupt) as info:
                store.get(sid)
            assert info.value.session_id == sid and "pickle" in info.value.reason
            assert logs == [
                {
                    "event": "session.corrupt",
                    "log_level": "warning",
                    "session_id": sid,
                    "reason": info.value.reason,
                    "directory": str(tmp_path),
                }
            ]
        with pytest.raises(SessionCorrupt):
            store.export("s")
        with pytest.raises(SessionCorrupt):
            store.append_turn("s", "u", "a")
        with pytest.raises(SessionCorrupt):
            store.fork("s", "copy")
        assert not marker.exists()
        assert store.list() == ["d", "ok", "s"] and store.get("ok") == ok
        store.import_(store.export("ok"), new_id="s", overwrite=True)
        assert store.get("s").system == "fine"
        store.delete("d")
        with pytest.raises(SessionNotFound):
            store.get("d")
    assert not marker.exists()


def test_a_pickled_key_is_skipped_and_reported_never_unpickled(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        store.create("ok")
    marker = tmp_path.parent / f"{tmp_path.name}-unpickled"
    plant(tmp_path, Boom(marker), b"x")
    plant(tmp_path, b"bytes-key", b"x")
    plant(tmp_path, "not a session id!", b"x")
    with DiskStore(tmp_path) as store, capture_logs() as logs:
        assert store.list() == ["ok"]
        assert store.get("ok").id == "ok"
    assert not marker.exists()
    bad = [(e["event"], e["reason"]) for e in logs]
    assert bad == [
        ("store.bad_key", "a pickled key; skipped"),
        ("store.bad_key", "a bytes key that is not a session id; skipped"),
        ("store.bad_key", "a str key that is not a session id; skipped"),
    ]


# --- checksums ------------------------------------------------------------------------------------


def test_a_flipped_bit_in_a_stored_message_is_corrupt(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        store.create("s")
        store.append_turn("s", "hello", "world")
        other = store.append_turn(store.create("other").id, "u", "a")
    row = bytearray(rows(tmp_path)["s"])
    at = row.index(b"world")
    row[at] ^= 0x01  # "world" -> "vorld": still valid msgpack, still a valid session
    set_row(tmp_path, "s", bytes(row))
    with DiskStore(tmp_path) as store:
        with pytest.raises(SessionCorrupt, match="checksum mismatch") as info:
            store.get("s")
        assert info.value.session_id == "s"
        with pytest.raises(SessionCorrupt):
            store.append_turn("s", "u", "a")
        assert store.get("other") == other
        assert store.list() == ["other", "s"]


def test_every_single_bit_flip_of_a_record_is_caught() -> None:
    messages = (Message("user", "hi", 1.0), Message("assistant", "yo", 2.0))
    session = Session(id="s", system="sys", messages=messages, created=1.0, updated=2.0, revision=1)
    record = encode_record(session)
    assert record[: len(MAGIC)] == MAGIC and decode_record("s", record) == session
    for bit in range(len(record) * 8):
        damaged = bytearray(record)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SessionCorrupt):
            decode_record("s", bytes(damaged))
    for cut in range(len(record)):
        with pytest.raises(SessionCorrupt):
            decode_record("s", record[:cut])


def test_a_previous_format_record_still_reads_and_is_rewritten_with_a_checksum(tmp_path: Path) -> None:
    legacy = Session(
        id="legacy",
        system="be brief",
        messages=(Message("user", "hello", 1700000002.0), Message("assistant", "hi there", 1700000002.0)),
        sampling=Sampling(seed=7),
        metadata={"tag": ["old"]},
        created=1700000001.0,
        updated=1700000002.0,
        revision=1,
    )
    with DiskStore(tmp_path) as store:
        store.create("new")
    plant(tmp_path, "legacy", LEGACY_RECORD)
    assert rows(tmp_path)["legacy"] == LEGACY_RECORD
    with DiskStore(tmp_path) as store:
        assert store.get("legacy") == legacy
        assert store.list() == ["legacy", "new"]
        after = store.append_turn("legacy", "again", "sure", expected_revision=1)
    assert after.messages[:2] == legacy.messages and after.revision == 2
    assert rows(tmp_path)["legacy"] == encode_record(after)


# --- stores that cannot be used -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda db: db.write_bytes(b"this is not a database" * 300), "file is not a database"),
        (lambda db: db.write_bytes(db.read_bytes()[: db.stat().st_size // 2]), "malformed"),
        (lambda db: db.write_bytes(db.read_bytes()[:12288] + bytes(8192) + db.read_bytes()[20480:]), "malformed"),
    ],
    ids=["not-a-database", "truncated", "zeroed-pages"],
)
def test_a_damaged_database_is_store_unavailable(tmp_path: Path, damage: Callable[[Path], Any], reason: str) -> None:
    with DiskStore(tmp_path) as store:
        for i in range(40):
            store.create(f"s{i}", system="x" * 1000)
    damage(tmp_path / "cache.db")
    before = (tmp_path / "cache.db").read_bytes()
    with pytest.raises(StoreUnavailable) as info, DiskStore(tmp_path) as store:
        for sid in store.list():
            store.get(sid)
    assert info.value.location == str(tmp_path) and reason in info.value.reason
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert (tmp_path / "cache.db").read_bytes() == before


def test_a_directory_that_is_a_file_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.write_bytes(b"a file")
    with pytest.raises(StoreUnavailable) as info:
        DiskStore(path)
    assert info.value.location == str(path)
    assert path.read_bytes() == b"a file"


def test_a_full_database_refuses_the_write_and_changes_nothing(tmp_path: Path) -> None:
    with DiskStore(tmp_path) as store:
        store.create("s")
        before = store.append_turn("s", "u", "a")
        store.create("other")
    with sqlite3.connect(tmp_path / "cache.db") as db:
        (pages,) = db.execute("PRAGMA page_count").fetchone()
        # diskcache applies sqlite_* settings on every connection: the database cannot grow any more.
        db.execute("INSERT OR REPLACE INTO Settings VALUES ('sqlite_max_page_count', ?)", (pages,))
    with DiskStore(tmp_path) as store:
        with pytest.raises(StoreUnavailable) as info:
            store.append_turn("s", "u" * 100_000, "a")
        assert "full" in info.value.reason and info.value.location == str(tmp_path)
        assert store.get("s") == before
        assert store.list() == ["other", "s"]
        assert store.append_turn("other", "small", "fits").revision == 1


def unprivileged(fn: Callable[[], object]) -> dict[str, Any]:
    """Run `fn` where permission bits apply (a forked child as `nobody` when we are root); its outcome."""
    if os.geteuid() != 0:
        return _outcome(fn)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            data = json.dumps(_outcome(fn)).encode()
        except BaseException as err:
            data = json.dumps({"error": "child", "reason": repr(err)}).encode()
        os.write(write, data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def _outcome(fn: Callable[[], object]) -> dict[str, Any]:
    try:
        return {"result": fn()}
    except StoreUnavailable as err:
        return {"error": "StoreUnavailable", "location": err.location, "reason": err.reason}
    except BaseException as err:
        return {"error": type(err).__name__, "reason": str(err)}


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory that an unprivileged user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="turnstile-ro-"))
    path.chmod(0o755)
    yield path
    for p in (path, *path.iterdir()):
        p.chmod(0o755 if p.is_dir() else 0o644)
    for p in path.iterdir():
        p.unlink()
    path.rmdir()


@pytest.mark.parametrize("file_mode", [0o444, 0o666])
def test_a_read_only_directory_is_store_unavailable_and_unchanged(open_dir: Path, file_mode: int) -> None:
    with DiskStore(open_dir) as store:
        store.create("s")
        store.append_turn("s", "u", "a")
    for p in open_dir.iterdir():
        p.chmod(file_mode)
    open_dir.chmod(0o555)
    before = files(open_dir)

    def write() -> int:
        with DiskStore(open_dir) as store:
            return store.append_turn("s", "more", "turns").revision

    def read() -> list[str]:
        with DiskStore(open_dir) as store:
            return store.list()

    for op in (write, read):
        outcome = unprivileged(op)
        assert outcome["error"] == "StoreUnavailable", outcome
        assert outcome["location"] == str(open_dir) and "readonly" in outcome["reason"]
    assert files(open_dir) == before
    open_dir.chmod(0o755)
    with DiskStore(open_dir) as store:
        assert store.get("s").revision == 1


def test_a_new_store_in_a_read_only_directory_is_store_unavailable(open_dir: Path) -> None:
    open_dir.chmod(0o555)
    outcome = unprivileged(lambda: DiskStore(open_dir / "sessions").list())
    assert outcome["error"] == "StoreUnavailable" and outcome["location"] == str(open_dir / "sessions")
    outcome = unprivileged(lambda: DiskStore(open_dir).list())
    assert outcome["error"] == "StoreUnavailable" and outcome["location"] == str(open_dir)
    assert list(open_dir.iterdir()) == []


# --- SIGKILL --------------------------------------------------------------------------------------

WRITER = """
    import sys
    where, tag, n_sessions = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if where.startswith("redis://"):
        from sessions.redis import RedisStore
        store = RedisStore.from_url(where)
    else:
        from sessions import DiskStore
        store = DiskStore(where)
    for i in range(1_000_000):
        store.append_turn(f"s{i % n_sessions}", f"{tag} u{i}", f"{tag} a{i} " + "x" * (i * 37 % 700))
        sys.stdout.write(f"{i}\\n")
        sys.stdout.flush()
"""


def run_writer_until_killed(where: str, tag: str, n_sessions: int, kill_after: int) -> int:
    """Start a writer on the store at `where`, SIGKILL it once it acknowledged `kill_after` turns.

    Returns how many turns it acknowledged (acks already in the pipe at the kill count too).
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", textwrap.dedent(WRITER), where, tag, str(n_sessions)]
    child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE)
    assert child.stdout is not None
    acked = 0
    try:
        while acked < kill_after:
            line = child.stdout.readline()
            assert line.endswith(b"\n"), f"the writer stopped on its own (exit {child.poll()})"
            assert int(line) == acked
            acked += 1
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        rest = child.stdout.read()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    for line in rest.split(b"\n")[:-1]:  # whole lines only
        assert int(line) == acked
        acked += 1
    return acked


def check_sigkill_rounds(
    where: str, open_store: Callable[[], StoreBase], stored_records: Callable[[], dict[str, bytes]]
) -> None:
    """Six rounds of a writer on 4 sessions killed at a random point; after each, check every record.

    Every acknowledged turn is present exactly once (at most the one in flight at the kill besides),
    earlier rounds are untouched, and every stored record carries the header and passes its checksum.
    """
    n_sessions, rng = 4, random.Random(16)
    with open_store() as store:
        for k in range(n_sessions):
            store.create(f"s{k}")
    kept: dict[str, tuple[Message, ...]] = {f"s{k}": () for k in range(n_sessions)}
    for round in range(6):
        acked = run_writer_until_killed(where, f"r{round}", n_sessions, kill_after=rng.randint(1, 60))
        with open_store() as store:
            sessions = {sid: store.get(sid) for sid in store.list()}
        assert sorted(sessions) == sorted(kept)
        committed: list[int] = []
        for sid, session in sessions.items():
            assert session.messages[: len(kept[sid])] == kept[sid]
            new = session.messages[len(kept[sid]) :]
            assert len(new) % 2 == 0
            indexes = [int(m.content.split()[1][1:]) for m in new[::2]]
            assert indexes == sorted(indexes) and all(i % n_sessions == int(sid[1:]) for i in indexes)
            assert [(m.role, m.content) for m in new] == [
                pair
                for i in indexes
                for pair in (("user", f"r{round} u{i}"), ("assistant", f"r{round} a{i} " + "x" * (i * 37 % 700)))
            ]
            assert session.revision == len(session.messages) // 2
            committed += indexes
            kept[sid] = session.messages
        assert sorted(committed) in (list(range(acked)), list(range(acked + 1)))
        stored = stored_records()
        assert sorted(stored) == sorted(kept)
        for sid, record in stored.items():
            assert record[: len(MAGIC)] == MAGIC
            assert decode_record(sid, record) == sessions[sid]  # passes its checksum
            assert msgspec.msgpack.decode(record[HEADER_SIZE:], type=Session) == sessions[sid]


def test_sigkill_at_random_points_keeps_every_acknowledged_turn_exactly_once(tmp_path: Path) -> None:
    check_sigkill_rounds(str(tmp_path), lambda: DiskStore(tmp_path), lambda: rows(tmp_path))
