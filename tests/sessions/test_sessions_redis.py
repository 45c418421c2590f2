"""RedisStore on a real redis-server: layout, prefixes, races, damaged records and unusable servers.

The store contract itself (every operation, as on the memory and disk stores) is in
test_sessions_store.py; this module covers what is particular to Redis.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.errors import StoreConfigError, StoreUnavailable
from runtime.log import capture_logs
from sessions import RevisionConflict, Session, SessionCorrupt, SessionNotFound
from sessions.record import MAGIC, encode_record
from sessions.redis import DEFAULT_PREFIX, RedisStore
from tests.sessions.test_sessions_faults import LEGACY_RECORD, check_sigkill_rounds
from tests.support.redis_server import RedisServer, free_port, running_redis, start_redis

ROOT = Path(__file__).resolve().parents[2]
NO_RETRY = Retry(NoBackoff(), 0)


def encode_json(session: Session) -> bytes:
    return msgspec.json.encode(session)


@pytest.fixture
def store(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[RedisStore]:
    with RedisStore.from_url(redis_server.url) as s:
        yield s


def test_each_session_is_one_checksummed_string(store: RedisStore, redis_client: redis.Redis) -> None:
    created = store.create("s", system="sys")
    turned = store.append_turn("s", "hi", "hello")
    # one string per session, and beside the prefix the sessions' count (sessions/redis.py)
    assert sorted(redis_client.keys("*")) == [b"turnstile:session#count", b"turnstile:session:s"]
    assert DEFAULT_PREFIX == "turnstile:session:" and redis_client.get("turnstile:session#count") == b"1"
    assert redis_client.type("turnstile:session:s") == b"string"
    record = redis_client.get("turnstile:session:s")
    assert record == encode_record(turned) and record[: len(MAGIC)] == MAGIC
    assert created.revision == 0 and store.get("s") == turned
    assert store.location == f"redis://127.0.0.1:{redis_client.connection_pool.connection_kwargs['port']}/0"


def test_prefixes_keep_stores_apart(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    redis_client.set("unrelated", b"x")
    redis_client.set("x1yz:s", b"x")  # matched by the glob x[1]*?: unless the prefix is escaped
    with (
        RedisStore.from_url(redis_server.url, prefix="a:") as a,
        RedisStore.from_url(redis_server.url, prefix="b:") as b,
        RedisStore.from_url(redis_server.url, prefix="x[1]*?:") as odd,
    ):
        a.create("s", system="in a")
        b.create("s", system="in b")
        b.create("t")
        odd.create("s")
        assert (a.list(), b.list(), odd.list()) == (["s"], ["s", "t"], ["s"])
        assert a.get("s").system == "in a" and b.get("s").system == "in b"
        a.delete("s")
        assert not a.exists("s") and b.exists("s")
    assert sorted(redis_client.keys("*")) == [
        *(b"a#count", b"b#count", b"b:s", b"b:t", b"unrelated", b"x1yz:s", b"x[1]*?#count", b"x[1]*?:s")
    ]
    assert [redis_client.get(k) for k in (b"a#count", b"b#count", b"x[1]*?#count")] == [b"0", b"2", b"1"]


def test_keys_that_are_not_session_ids_are_skipped(store: RedisStore, redis_client: redis.Redis) -> None:
    store.create("ok")
    redis_client.set(b"turnstile:session:not an id", b"x")
    redis_client.set(b"turnstile:session:\xff", b"x")
    with capture_logs() as logs:
        assert store.list() == ["ok"]
    assert sorted(e["key"] for e in logs if e["event"] == "store.bad_key") == sorted(
        [repr(b"turnstile:session:not an id"), repr(b"turnstile:session:\xff")]
    )


def test_two_clients_share_sessions_and_revisions(redis_server: RedisServer, store: RedisStore) -> None:
    with RedisStore.from_url(redis_server.url) as other:
        store.create("s")
        assert other.append_turn("s", "u", "a", expected_revision=0).revision == 1
        with pytest.raises(RevisionConflict) as info:
            store.append_turn("s", "x", "y", expected_revision=0)
        assert (info.value.expected, info.value.actual) == (0, 1)
        assert store.get("s") == other.get("s")
        other.delete("s")
        with pytest.raises(SessionNotFound):
            store.get("s")


class RacingClock:
    """A clock that lets another writer commit first on its first call (between the read and EXEC)."""

    def __init__(self, race: Callable[[], object]) -> None:
        self.calls = 0
        self.race = race

    def __call__(self) -> float:
        self.calls += 1
        if self.calls == 1:
            self.race()
        return 1000.0 + self.calls


def test_a_write_that_loses_a_race_runs_again_on_fresh_data(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    with RedisStore.from_url(redis_server.url) as other:
        other.create("s")
        clock = RacingClock(lambda: other.append_turn("s", "first", "winner"))
        with RedisStore.from_url(redis_server.url, clock=clock) as store:
            s = store.append_turn("s", "second", "loser, retried")
        assert [m.content for m in s.messages] == ["first", "winner", "second", "loser, retried"]
        assert s.revision == 2 and clock.calls == 2 and other.get("s") == s

        clock = RacingClock(lambda: other.append_turn("s", "third", "winner again"))
        with RedisStore.from_url(redis_server.url, clock=clock) as store, pytest.raises(RevisionConflict) as info:
            store.append_turn("s", "x", "y", expected_revision=2)
        assert (info.value.expected, info.value.actual) == (2, 3)
        assert [m.content for m in other.get("s").messages][4:] == ["third", "winner again"]


APPENDER = """
    import sys
    from sessions.redis import RedisStore
    store = RedisStore.from_url(sys.argv[1])
    for i in range(int(sys.argv[3])):
        store.append_turn("shared", f"{sys.argv[2]}u{i}", f"{sys.argv[2]}a{i}")
"""


def test_processes_appending_to_one_session_lose_nothing(redis_server: RedisServer, store: RedisStore) -> None:
    store.create("shared")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(APPENDER), redis_server.url, tag, "40"], env=env)
        for tag in ("p", "q", "r")
    ]
    assert [child.wait(timeout=120) for child in children] == [0, 0, 0]
    s = store.get("shared")
    assert s.revision == 120
    pairs = [(s.messages[i].content, s.messages[i + 1].content) for i in range(0, len(s.messages), 2)]
    assert all(u.replace("u", "a") == a for u, a in pairs)
    for tag in ("p", "q", "r"):
        assert [u for u, _ in pairs if u[0] == tag] == [f"{tag}u{i}" for i in range(40)]


def test_damaged_records_are_corrupt_and_the_rest_unaffected(store: RedisStore, redis_client: redis.Redis) -> None:
    ok = store.append_turn(store.create("ok").id, "u", "a")
    store.create("flip")
    store.append_turn("flip", "hello", "world")
    stored = redis_client.get("turnstile:session:flip")
    assert isinstance(stored, bytes)
    record = bytearray(stored)
    record[record.index(b"world")] ^= 0x01
    redis_client.set("turnstile:session:flip", bytes(record))
    redis_client.set("turnstile:session:pickled", pickle.dumps({"id": "pickled"}))
    redis_client.set("turnstile:session:short", MAGIC + b"\x01")
    redis_client.hset("turnstile:session:hash", "field", "value")
    reasons = {
        "flip": "checksum mismatch",
        "pickled": "missing required field",
        "short": "shorter than its 12-byte header",
        "hash": "not a string",
    }
    for sid, reason in reasons.items():
        with capture_logs() as logs, pytest.raises(SessionCorrupt, match=reason) as info:
            store.get(sid)
        assert info.value.session_id == sid and logs[0]["event"] == "session.corrupt"
        with pytest.raises(SessionCorrupt):
            store.append_turn(sid, "u", "a")
    assert store.list() == ["flip", "hash", "ok", "pickled", "short"]
    assert store.get("ok") == ok
    store.import_(store.export("ok"), new_id="hash", overwrite=True)
    assert store.get("hash").messages == ok.messages
    store.delete("flip")
    assert store.list() == ["hash", "ok", "pickled", "short"]


def test_a_previous_format_record_still_reads(store: RedisStore, redis_client: redis.Redis) -> None:
    redis_client.set("turnstile:session:legacy", LEGACY_RECORD)
    legacy = store.get("legacy")
    assert legacy.system == "be brief" and [m.content for m in legacy.messages] == ["hello", "hi there"]
    after = store.append_turn("legacy", "again", "sure", expected_revision=1)
    assert redis_client.get("turnstile:session:legacy") == encode_record(after)


def test_a_server_that_goes_away_is_store_unavailable(tmp_path: Path) -> None:
    redis_server = start_redis(tmp_path)
    try:
        store = RedisStore.from_url(redis_server.url, retry=NO_RETRY)
        store.create("s")
    finally:
        redis_server.stop()
    ops: list[Callable[[], object]] = [
        lambda: store.get("s"),
        lambda: store.exists("s"),
        lambda: store.list(),
        lambda: store.create("t"),
        lambda: store.append_turn("s", "u", "a"),
        lambda: store.delete("s"),
    ]
    for op in ops:
        with pytest.raises(StoreUnavailable) as info:
            op()
        assert info.value.location == f"redis://127.0.0.1:{redis_server.port}/0"
        assert isinstance(info.value.__cause__, redis.ConnectionError)
    store.close()
    with pytest.raises(StoreUnavailable, match="Connection refused"):
        RedisStore.from_url(redis_server.url, retry=NO_RETRY)


def test_a_password_is_never_shown(tmp_path: Path) -> None:
    with running_redis(tmp_path, "--requirepass", "right-secret") as redis_server:
        url = redis_server.url.replace("redis://", "redis://:wrong-secret@")
        with pytest.raises(StoreUnavailable) as info:
            RedisStore.from_url(url, retry=NO_RETRY)
        assert "secret" not in str(info.value) and info.value.location == redis_server.url
        with pytest.raises(StoreUnavailable, match="AuthenticationError"):
            RedisStore.from_url(redis_server.url, retry=NO_RETRY)
        with RedisStore.from_url(redis_server.url.replace("redis://", "redis://:right-secret@")) as store:
            assert store.create("s").id == "s" and store.location == redis_server.url


def test_a_full_server_refuses_writes_and_changes_nothing(store: RedisStore, redis_client: redis.Redis) -> None:
    s = store.append_turn(store.create("s").id, "u", "a")
    redis_client.config_set("maxmemory", "1")  # noeviction: every write is refused with OOM
    try:
        with pytest.raises(StoreUnavailable, match="maxmemory"):
            store.append_turn("s", "u" * 100_000, "a")
        with pytest.raises(StoreUnavailable, match="maxmemory"):
            store.create("t")
        assert store.get("s") == s and store.list() == ["s"]
    finally:
        redis_client.config_set("maxmemory", "0")
    assert store.append_turn("s", "now", "fits").revision == 2


def test_a_read_only_replica_refuses_writes(tmp_path: Path) -> None:
    replica_of = ("--replicaof", "127.0.0.1", str(free_port()))
    with running_redis(tmp_path, *replica_of) as replica, RedisStore.from_url(replica.url) as store:
        doc = Session(id="s", created=1.0, updated=1.0)
        ops: list[Callable[[], object]] = [lambda: store.create("t"), lambda: store.import_(encode_json(doc))]
        for op in ops:
            with pytest.raises(StoreUnavailable, match="read only replica") as info:
                op()
            assert info.value.location == replica.url
        assert store.list() == []


def test_bad_configuration_is_refused(redis_server: RedisServer) -> None:
    for url in ("http://127.0.0.1:1", "redis://127.0.0.1:notaport", 42):
        with pytest.raises(StoreConfigError) as info:
            RedisStore.from_url(url)  # type: ignore[arg-type]
        assert isinstance(info.value, ValueError)
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as text_client, pytest.raises(StoreConfigError):
        RedisStore(text_client)
    with redis.Redis.from_url(redis_server.url) as c, pytest.raises(StoreConfigError):
        RedisStore(c, prefix=b"bytes")  # type: ignore[arg-type]
    with pytest.raises(StoreConfigError):
        RedisStore("redis://127.0.0.1")  # type: ignore[arg-type]


def test_a_store_leaves_a_client_it_was_given_open(redis_client: redis.Redis) -> None:
    with RedisStore(redis_client) as store:
        store.create("s")
    assert redis_client.exists("turnstile:session:s") == 1


def test_sigkill_at_random_points_keeps_every_acknowledged_turn_exactly_once(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    def stored_records() -> dict[str, bytes]:
        records = {}
        for key in redis_client.keys("turnstile:session:*"):
            value = redis_client.get(key)
            assert isinstance(key, bytes) and isinstance(value, bytes)
            records[key.decode().removeprefix("turnstile:session:")] = value
        return records

    check_sigkill_rounds(redis_server.url, lambda: RedisStore.from_url(redis_server.url), stored_records)
