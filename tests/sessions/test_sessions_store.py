"""Every store operation, on every store: memory, disk and Redis (a real redis-server, see
tests/support/redis_server.py)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessions import (
    DiskStore,
    InvalidHistoryOp,
    InvalidSampling,
    InvalidSession,
    InvalidSessionId,
    MemoryStore,
    Message,
    RevisionConflict,
    Sampling,
    Session,
    SessionExists,
    SessionNotFound,
    SessionStore,
    history,
)
from sessions.base import StoreBase
from tests.sessions.test_sessions_model import BAD_IDS, BAD_SAMPLING
from tests.support.redis_server import running_redis

Op = Callable[[], object]


class Clock:
    """A fake clock: 1000.0, 1001.0, ... one second per call."""

    def __init__(self) -> None:
        self.now = 999.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += 1.0
            return self.now


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real redis-server for this module's tests (each test starts from an empty database)."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(params=["memory", "disk", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreBase]:
    s: StoreBase
    if request.param == "memory":
        s = MemoryStore(clock=Clock())
    elif request.param == "disk":
        s = DiskStore(tmp_path, clock=Clock())
    else:
        import redis  # only the Redis tests need the client library

        from sessions.redis import RedisStore

        url = request.getfixturevalue("redis_url")
        with redis.Redis.from_url(url) as client:
            client.flushdb()
        s = RedisStore.from_url(url, clock=Clock())
    yield s
    s.close()


def snapshot(store: StoreBase) -> dict[str, Session]:
    return {sid: store.get(sid) for sid in store.list()}


def turns(store: StoreBase, sid: str, n: int) -> Session:
    s = store.get(sid)
    for i in range(n):
        s = store.append_turn(sid, f"u{i}", f"a{i}")
    return s


def test_is_a_session_store(store: StoreBase) -> None:
    assert isinstance(store, SessionStore)


def test_create_get_exists_list(store: StoreBase) -> None:
    a = store.create("b")
    assert a == Session(id="b", created=1000.0, updated=1000.0, revision=0)
    c = store.create("a", system="sys", sampling=Sampling(seed=1), metadata={"k": {"v": [1, 2.5, None]}})
    assert c == Session(
        id="a",
        system="sys",
        sampling=Sampling(seed=1),
        metadata={"k": {"v": [1, 2.5, None]}},
        created=1001.0,
        updated=1001.0,
    )
    assert store.create("c", sampling={"temperature": 0}).sampling == Sampling(temperature=0.0)
    assert store.get("a") == c and store.get("b") == a
    assert store.exists("a") and not store.exists("zz")
    assert store.list() == ["a", "b", "c"]


def test_create_existing_is_refused(store: StoreBase) -> None:
    store.create("a", system="first")
    before = snapshot(store)
    with pytest.raises(SessionExists) as info:
        store.create("a", system="second")
    assert info.value.session_id == "a"
    assert snapshot(store) == before


def test_missing_sessions(store: StoreBase) -> None:
    ops: list[Op] = [
        lambda: store.get("nope"),
        lambda: store.delete("nope"),
        lambda: store.append_turn("nope", "u", "a"),
        lambda: store.undo("nope"),
        lambda: store.edit("nope", 0, "x"),
        lambda: store.truncate("nope", 0),
        lambda: store.export("nope"),
        lambda: store.fork("nope", "new"),
        lambda: store.put(Session(id="nope", created=1.0, updated=1.0), expected_revision=0),
    ]
    for op in ops:
        with pytest.raises(SessionNotFound) as info:
            op()
        assert info.value.session_id == "nope"
    assert store.list() == []


def test_delete(store: StoreBase) -> None:
    store.create("a")
    store.create("b")
    store.delete("a")
    assert store.list() == ["b"] and not store.exists("a")
    store.create("a")
    assert store.get("a").messages == ()


def test_append_turn_commits_both_messages(store: StoreBase) -> None:
    store.create("s")
    s1 = store.append_turn("s", "hi", "hello")
    assert s1.messages == (Message("user", "hi", 1001.0), Message("assistant", "hello", 1001.0))
    assert (s1.revision, s1.created, s1.updated) == (1, 1000.0, 1001.0)
    s2 = store.append_turn("s", "more", "sure", expected_revision=1)
    assert s2.revision == 2 and s2.messages[2:] == (
        Message("user", "more", 1002.0),
        Message("assistant", "sure", 1002.0),
    )
    assert store.get("s") == s2


def test_stale_revision_is_refused(store: StoreBase) -> None:
    store.create("s")
    store.append_turn("s", "hi", "hello")
    before = snapshot(store)
    ops: list[Op] = [
        lambda: store.append_turn("s", "x", "y", expected_revision=0),
        lambda: store.undo("s", expected_revision=0),
        lambda: store.edit("s", 0, "x", expected_revision=2),
        lambda: store.truncate("s", 0, expected_revision=0),
        lambda: store.put(before["s"], expected_revision=0),
    ]
    for op in ops:
        with pytest.raises(RevisionConflict) as info:
            op()
        assert (info.value.session_id, info.value.actual) == ("s", 1)
    assert snapshot(store) == before
    with pytest.raises(InvalidSession):
        store.append_turn("s", "x", "y", expected_revision="1")  # type: ignore[arg-type]
    assert snapshot(store) == before


def test_put_is_compare_and_swap(store: StoreBase) -> None:
    s = store.create("s")
    changed = Session(id="s", system="new", messages=(Message("user", "q", 5.0),), created=s.created, updated=0.0)
    stored = store.put(changed, expected_revision=0)
    assert stored == Session(
        id="s",
        system="new",
        messages=(Message("user", "q", 5.0),),
        created=1000.0,
        updated=1001.0,
        revision=1,
    )
    assert store.get("s") == stored
    with pytest.raises(RevisionConflict) as info:
        store.put(changed, expected_revision=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    bad = store.get("s")
    bad.metadata["x"] = {1, 2}
    with pytest.raises(InvalidSession):
        store.put(bad, expected_revision=1)
    assert store.get("s") == stored


def test_fork(store: StoreBase) -> None:
    store.create("src", system="sys", sampling=Sampling(top_k=5), metadata={"tags": ["a"]})
    src = turns(store, "src", 3)
    f = store.fork("src", "f")
    assert f == Session(
        id="f",
        system="sys",
        messages=src.messages,
        sampling=Sampling(top_k=5),
        metadata={"tags": ["a"]},
        created=1004.0,
        updated=1004.0,
    )
    g = store.fork("src", "g", upto=2)
    assert g.messages == src.messages[:2] and g.revision == 0
    store.append_turn("f", "only f", "yes")
    assert store.get("src") == src
    assert store.list() == ["f", "g", "src"]
    before = snapshot(store)
    with pytest.raises(SessionExists):
        store.fork("src", "g")
    with pytest.raises(InvalidHistoryOp):
        store.fork("src", "h", upto=7)
    assert snapshot(store) == before


def test_undo(store: StoreBase) -> None:
    store.create("s")
    full = turns(store, "s", 3)
    one = store.undo("s")
    assert one.messages == full.messages[:4] and one.revision == 4
    store.edit("s", 2, "again")
    assert store.undo("s", 2, expected_revision=5).messages == ()
    before = snapshot(store)
    for bad in (0, 1, -1):
        with pytest.raises(InvalidHistoryOp):
            store.undo("s", bad)
    assert snapshot(store) == before


def test_edit_then_reply(store: StoreBase) -> None:
    store.create("s")
    full = turns(store, "s", 3)
    edited = store.edit("s", 2, "u1 again")
    assert edited.messages == (*full.messages[:2], Message("user", "u1 again", 1004.0))
    assert edited.revision == 4
    replied = store.append_reply("s", "a1 again", expected_revision=4)
    assert replied.messages[2:] == (
        Message("user", "u1 again", 1004.0),
        Message("assistant", "a1 again", 1005.0),
    )
    assert store.edit("s", -4, "u0'").messages == (Message("user", "u0'", 1006.0),)
    before = snapshot(store)
    edits: list[Op] = [lambda: store.edit("s", 1, "x"), lambda: store.edit("s", -2, "x")]
    for op in edits:
        with pytest.raises(InvalidHistoryOp):
            op()
    assert snapshot(store) == before
    store.append_reply("s", "r")
    before = snapshot(store)
    later_ops: list[Op] = [
        lambda: store.append_reply("s", "twice"),
        lambda: store.edit("s", 1, "not a user message"),
        lambda: store.edit("s", 2, "x"),
    ]
    for op in later_ops:
        with pytest.raises(InvalidHistoryOp):
            op()
    assert snapshot(store) == before


def test_truncate(store: StoreBase) -> None:
    store.create("s")
    full = turns(store, "s", 2)
    assert store.truncate("s", 3).messages == full.messages[:3]
    assert store.truncate("s", 0).messages == ()
    before = snapshot(store)
    with pytest.raises(InvalidHistoryOp):
        store.truncate("s", 1)
    assert snapshot(store) == before


def test_export_import_round_trip(store: StoreBase, tmp_path: Path) -> None:
    store.create("s", system="be brief", sampling=Sampling(stop=("\n",), seed=9), metadata={"a": [True]})
    turns(store, "s", 2)
    original = store.get("s")
    text = store.export("s")
    assert json.loads(text)["messages"][:2] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "u0", "created": 1001.0},
    ]
    store.delete("s")
    assert store.import_(text) == original
    assert store.get("s") == original
    other = DiskStore(tmp_path / "other") if isinstance(store, MemoryStore) else MemoryStore()
    with other:
        assert other.import_(text) == original
    copy = store.import_(text, new_id="copy")
    assert copy == Session(**{**{f: getattr(original, f) for f in original.__struct_fields__}, "id": "copy"})
    assert store.list() == ["copy", "s"]


def test_import_onto_an_existing_id(store: StoreBase) -> None:
    store.create("s")
    old = store.export("s")
    turns(store, "s", 2)
    before = snapshot(store)
    with pytest.raises(SessionExists):
        store.import_(old)
    assert snapshot(store) == before
    replaced = store.import_(old, overwrite=True)
    assert replaced.messages == () and replaced.revision == 3
    with pytest.raises(RevisionConflict):
        store.append_turn("s", "x", "y", expected_revision=2)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_ids_are_refused_and_change_nothing(store: StoreBase, bad: Any) -> None:
    store.create("ok")
    store.append_turn("ok", "u", "a")
    before = snapshot(store)
    doc = store.export("ok")
    ops: list[Op] = [
        lambda: store.create(bad),
        lambda: store.get(bad),
        lambda: store.exists(bad),
        lambda: store.delete(bad),
        lambda: store.append_turn(bad, "u", "a"),
        lambda: store.append_reply(bad, "a"),
        lambda: store.undo(bad),
        lambda: store.edit(bad, 0, "x"),
        lambda: store.truncate(bad, 0),
        lambda: store.export(bad),
        lambda: store.fork(bad, "new"),
        lambda: store.fork("ok", bad),
    ]
    if bad is not None:  # new_id=None means "keep the document's id"
        ops.append(lambda: store.import_(doc, new_id=bad))
    if isinstance(bad, str):
        ops.append(lambda: store.import_(doc.replace('"id":"ok"', f'"id":{json.dumps(bad)}')))
    for op in ops:
        with pytest.raises(InvalidSessionId):
            op()
    assert snapshot(store) == before


@pytest.mark.parametrize(("field", "value"), BAD_SAMPLING)
def test_bad_sampling_is_refused_and_changes_nothing(store: StoreBase, field: str, value: Any) -> None:
    store.create("ok")
    before = snapshot(store)
    with pytest.raises(InvalidSampling) as info:
        store.create("new", sampling={field: value})
    assert info.value.field == field
    if not (isinstance(value, float) and not math.isfinite(value)):  # JSON has no NaN or infinity
        doc = json.loads(store.export("ok"))
        doc["sampling"][field] = value
        with pytest.raises(InvalidSampling) as info:
            store.import_(json.dumps(doc), new_id="new")
        assert info.value.field == field
    assert snapshot(store) == before


def test_bad_metadata_and_text_change_nothing(store: StoreBase) -> None:
    store.create("ok")
    before = snapshot(store)
    with pytest.raises(InvalidSession):
        store.create("new", metadata={"t": (1, 2)})
    with pytest.raises(InvalidSession):
        store.append_turn("ok", "u", None)  # type: ignore[arg-type]
    with pytest.raises(InvalidSession):
        store.import_("not json", new_id="new")
    assert snapshot(store) == before


def test_returned_values_are_not_shared_with_the_store(store: StoreBase) -> None:
    s = store.create("s", metadata={"list": [1]})
    s.metadata["list"].append(2)
    got = store.get("s")
    got.metadata["list"].append(3)
    assert store.get("s").metadata == {"list": [1]}


def test_eight_threads_lose_nothing(store: StoreBase) -> None:
    n_threads, n_turns = 8, 200
    for t in range(n_threads):
        store.create(f"t{t}")
    errors: list[BaseException] = []
    start = threading.Barrier(n_threads)

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(n_turns):
                store.append_turn(f"t{t}", f"u{t}.{i}", f"a{t}.{i}")
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    for t in range(n_threads):
        s = store.get(f"t{t}")
        assert s.revision == n_turns
        expected = [(r, f"{r[0]}{t}.{i}") for i in range(n_turns) for r in ("user", "assistant")]
        assert [(m.role, m.content) for m in s.messages] == expected


def test_two_writers_cannot_interleave_one_session(store: StoreBase) -> None:
    store.create("shared")
    n_writers, n_turns = 4, 25

    def work(w: int) -> None:
        for i in range(n_turns):
            while True:
                current = store.get("shared")
                try:
                    store.append_turn("shared", f"w{w}u{i}", f"w{w}a{i}", expected_revision=current.revision)
                    break
                except RevisionConflict:
                    continue

    threads = [threading.Thread(target=work, args=(w,)) for w in range(n_writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    s = store.get("shared")
    assert s.revision == n_writers * n_turns
    pairs = [(s.messages[i].content, s.messages[i + 1].content) for i in range(0, len(s.messages), 2)]
    assert all(u.replace("u", "a") == a for u, a in pairs)
    for w in range(n_writers):
        assert [u for u, _ in pairs if u.startswith(f"w{w}u")] == [f"w{w}u{i}" for i in range(n_turns)]


def test_history_module_and_store_agree(store: StoreBase) -> None:
    store.create("s")
    full = turns(store, "s", 3)
    assert store.undo("s", 2).messages == history.undo(full, 2).messages
