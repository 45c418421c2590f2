"""`Runtime.stats()` and `GET /metrics` never wait: not for a disk-tier write in progress, not for a store's I/O.

The disk tier's `put` is held mid-write (inside its transaction, its lock held) by the tier's `mid_put`
hook while /metrics is asked through the real ASGI app; a real redis-server holds 10,000 sessions and
the server's own command statistics show that answering ran no SCAN. The stores' kept session counts
are checked against `list()` after every kind of write, and across two stores sharing one directory or
one server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2 as httpx
import pytest
import redis

from caches.disk.tier import DiskTier
from runtime import Runtime
from runtime.errors import SessionExists
from runtime.serve.http import app as make_app
from runtime.testing import ScriptedBackend
from sessions import DiskStore, MemoryStore, Session
from sessions.base import StoreBase
from sessions.record import encode_record
from sessions.redis import DEFAULT_PREFIX, RedisStore
from tests.support.redis_server import RedisServer

HELD_AT_MOST = 60.0
"""How long the gate holds a put if nobody opens it: only a way out for a broken build (where /metrics
waits for the put), which then fails on `put_done`, instead of hanging. No test waits for it to pass."""


def samples(text: str) -> dict[str, float]:
    """The exposition text's samples by name (with labels)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def get_metrics(application: Any) -> dict[str, float]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://test") as c:
        r = await c.get("/metrics")
    assert r.status_code == 200
    return samples(r.text)


class PutGate:
    """The disk tier's `mid_put` hook: once armed, the next put stops inside its transaction until `open()`."""

    def __init__(self) -> None:
        self.armed = False
        self.arrived = threading.Event()
        self._open = threading.Event()

    def __call__(self) -> None:
        if self.armed:
            self.armed = False
            self.arrived.set()
            self._open.wait(HELD_AT_MOST)

    def open(self) -> None:
        self._open.set()


async def test_metrics_answer_while_a_disk_tier_put_is_held_mid_write(tmp_path: Path) -> None:
    gate = PutGate()
    tier = DiskTier(tmp_path / "disk", fingerprint="fp", limit_bytes=0, mid_put=gate)
    assert tier.put(range(10), b"x" * 1000) is True
    first = tier.stats()
    assert (first.entries, first.puts) == (1, 1)
    async with Runtime.serve(ScriptedBackend(n_ctx=400, disk=tier), MemoryStore()) as rt:
        application = make_app(rt)
        await rt.create_session("a")
        await rt.create_session("b")
        put_done = threading.Event()

        def spill() -> None:
            assert tier.put(range(100, 150), b"y" * 5000) is True
            put_done.set()

        gate.armed = True
        writer = threading.Thread(target=spill)
        writer.start()
        try:
            await anyio.to_thread.run_sync(gate.arrived.wait)  # the put is inside its transaction now
            m = await get_metrics(application)
            st = rt.stats()
            assert not put_done.is_set()  # answered while the put was held
            assert m['turnstile_state_entries{tier="disk"}'] == 1
            assert m['turnstile_state_bytes{tier="disk"}'] == first.bytes
            assert m["turnstile_sessions"] == 2
            assert st.disk == first and st.sessions == 2
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
                r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and not put_done.is_set()  # and so does a chat request
        finally:
            gate.open()
            await anyio.to_thread.run_sync(writer.join)
        assert put_done.is_set()
        m = await get_metrics(application)
        after = tier.stats()
        assert (after.entries, after.puts, after.bytes_written) == (2, 2, after.bytes)
        assert m['turnstile_state_entries{tier="disk"}'] == 2
        assert m['turnstile_state_bytes{tier="disk"}'] == after.bytes > first.bytes


def test_stats_do_not_wait_for_a_put_held_mid_write(tmp_path: Path) -> None:
    gate = PutGate()
    with DiskTier(tmp_path, fingerprint="fp", limit_bytes=0, mid_put=gate) as tier:
        tier.put(range(10), b"x" * 100)
        before = tier.stats()
        gate.armed = True
        writer = threading.Thread(target=tier.put, args=(range(10, 20), b"y" * 100))
        writer.start()
        try:
            assert gate.arrived.wait(HELD_AT_MOST)
            assert tier.stats() == before  # the write in progress is not in it, and stats() did not wait
        finally:
            gate.open()
            writer.join()
        assert (tier.stats().entries, tier.stats().puts) == (2, 2)


# --- the session count -----------------------------------------------------------------------------------


def scans(redis_client: redis.Redis) -> int:
    """SCAN calls the server has run (from a client or a script)."""
    info: dict[str, Any] = redis_client.info("commandstats")
    calls: int = info.get("cmdstat_scan", {}).get("calls", 0)
    return calls


async def test_metrics_count_10000_redis_sessions_without_a_scan(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    with redis_client.pipeline(transaction=False) as pipe:  # written as a store writes them, in one round trip
        for i in range(10_000):
            sid = f"s{i}"
            pipe.set(DEFAULT_PREFIX + sid, encode_record(Session(id=sid, created=1.0, updated=1.0)))
        pipe.execute()
    store = RedisStore.from_url(redis_server.url)  # a keyspace without the count: counted once, here
    assert store.count() == 10_000 and redis_client.get("turnstile:session#count") == b"10000"
    async with Runtime.serve(ScriptedBackend(), store) as rt:
        application = make_app(rt)
        before = scans(redis_client)
        assert rt.stats().sessions == 10_000
        assert (await get_metrics(application))["turnstile_sessions"] == 10_000
        await rt.create_session("one-more")
        await rt.delete("s0")
        await rt.chat("s1", "hi")
        assert rt.stats().sessions == 10_000
        await rt.create_session("and-another")
        assert (await get_metrics(application))["turnstile_sessions"] == 10_001
        assert scans(redis_client) == before  # nothing of this scanned the keyspace
    assert len(store.list()) == 10_001  # list() is the scan; count() is not
    listed = scans(redis_client)
    assert listed > before
    with RedisStore.from_url(redis_server.url) as again:  # the count is kept: a second open does not count again
        assert again.count() == 10_001 and scans(redis_client) == listed


def open_memory(_: Path, __: RedisServer | None) -> StoreBase:
    return MemoryStore()


def open_disk(tmp_path: Path, _: RedisServer | None) -> StoreBase:
    return DiskStore(tmp_path / "sessions")


def open_redis(_: Path, redis_server: RedisServer | None) -> StoreBase:
    assert redis_server is not None
    return RedisStore.from_url(redis_server.url)


STORES: dict[str, Callable[[Path, RedisServer | None], StoreBase]] = {
    "memory": open_memory,
    "disk": open_disk,
    "redis": open_redis,
}


@pytest.fixture(params=sorted(STORES))
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], StoreBase]:
    redis_server = None
    if request.param == "redis":
        redis_server = request.getfixturevalue("redis_server")
        request.getfixturevalue("redis_client")  # an empty keyspace
    return lambda: STORES[request.param](tmp_path, redis_server)


def test_the_kept_count_follows_every_kind_of_write(opener: Callable[[], StoreBase]) -> None:
    with opener() as store:
        seen: list[int] = []

        def check() -> None:
            assert store.count() == len(store.list())
            seen.append(store.count())

        check()
        for sid in ("a", "b", "c"):
            store.create(sid, system="x")
        check()
        with pytest.raises(SessionExists):
            store.create("a")
        check()
        store.append_turn("a", "hi", "hello")
        store.fork("a", "a2")
        check()
        exported = store.export("a")
        store.import_(exported, new_id="a3")
        store.import_(exported, overwrite=True)  # onto itself: no new session
        check()
        new = Session(id="d", created=1.0, updated=1.0)
        committed = store.commit(new, expected_revision=None)
        assert committed is not None
        check()
        assert store.revert("d", None, expected_revision=committed.revision)  # removes "d" again
        check()
        store.delete("b")
        store.delete("c")
        check()
        assert seen == [0, 3, 3, 4, 5, 6, 5, 3]


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_two_stores_on_one_place_share_the_count(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    redis_server = None
    if kind == "redis":
        redis_server = request.getfixturevalue("redis_server")
        request.getfixturevalue("redis_client")
    first, second = STORES[kind](tmp_path, redis_server), STORES[kind](tmp_path, redis_server)
    with first, second:
        for sid in ("a", "b", "c"):
            first.create(sid)
        second.create("d")
        assert second.count() == 4  # its write saw the shared count
        assert first.count() == 3  # as of its own last write: reading it does no I/O
        first.delete("a")
        assert first.count() == 3 == len(first.list())
        second.append_turn("b", "hi", "hello")  # a write that creates nothing still reads the count
        assert second.count() == 3
