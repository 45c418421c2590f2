"""The Responses API's store on its own (no model): LRU eviction by count and by bytes, claims that decide
between continuing a session in place and branching, orphaned sessions, tenants, persistence across a
reopen (LRU order kept), and damaged files refused."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from runtime.errors import InvalidConfig, ResponseNotFound
from runtime.log import capture_logs
from runtime.serve.http.responses.store import Record, ResponseStore


def rec(n: int, session: str = "s1", upto: int = 2, tenant: str = "a", pad: int = 0) -> Record:
    return Record(
        id=f"resp_{n:048x}",
        tenant=tenant,
        session=session,
        upto=upto,
        response={"id": f"resp_{n:048x}", "text": "x" * pad},
        items=[{"type": "message", "id": f"msg_{n}", "role": "user", "content": []}],
    )


def rid(n: int) -> str:
    return f"resp_{n:048x}"


def disk_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir())


def test_lru_by_count_and_orphans(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, max_responses=2)
    assert store.put(rec(1, "s1", 2)) == []
    assert store.put(rec(2, "s2", 2)) == []
    assert store.get("a", rid(1)).session == "s1"  # rid(1) is now the most recently used
    assert store.put(rec(3, "s3", 2)) == ["s2"]  # rid(2) evicted; nothing else points into s2
    with pytest.raises(ResponseNotFound, match="evicted") as e:
        store.get("a", rid(2))
    assert e.value.response_id == rid(2) and e.value.evicted
    with pytest.raises(ResponseNotFound, match="no such response"):
        store.get("a", rid(9))
    s = store.stats()
    assert (s.responses, s.evicted, s.bytes) == (2, 1, disk_bytes(tmp_path))


def test_bytes_limit_holds_on_disk(tmp_path: Path) -> None:
    one = len(msgspec.json.encode(rec(1, pad=500)))
    store = ResponseStore(tmp_path, max_bytes=3 * one + 10)
    for n in range(1, 8):
        store.put(rec(n, f"s{n}", pad=500))
        assert disk_bytes(tmp_path) <= 3 * one + 10
    assert store.stats().responses == 3
    assert [store.get("a", rid(n)).id for n in (5, 6, 7)] == [rid(5), rid(6), rid(7)]
    huge = rec(20, pad=10 * one)
    with capture_logs() as logs:
        assert store.put(huge) == ["s1"]  # never stored (alone over the limit); its session is free
    assert [e["event"] for e in logs] == ["responses.too_large"]
    with pytest.raises(ResponseNotFound):
        store.get("a", rid(20))


def test_claims_decide_in_place_or_branch() -> None:
    store = ResponseStore()
    first = rec(1, "s1", 2)
    store.put(first)
    assert store.claim(first)  # the newest revision of s1: continue in place
    assert not store.claim(first)  # a second continuation at the same time branches
    store.put(rec(2, "s1", 4))  # the in-place continuation recorded: the claim is gone
    assert not store.claim(first)  # s1 now goes further than first: branch
    assert store.claim(store.get("a", rid(2)))
    assert store.release("s1") == []  # the failed continuation: rid(1), rid(2) still point into s1
    assert store.delete("a", rid(1)) == []
    assert store.delete("a", rid(2)) == ["s1"]


def test_tenants_do_not_see_each_other() -> None:
    store = ResponseStore(max_responses=1)
    store.put(rec(1, tenant="a"))
    with pytest.raises(ResponseNotFound, match="no such response"):
        store.get("b", rid(1))
    with pytest.raises(ResponseNotFound):
        store.delete("b", rid(1))
    store.put(rec(2, "s2", tenant="a"))  # rid(1) evicted: tenant b is not told so
    with pytest.raises(ResponseNotFound, match="no such response"):
        store.get("b", rid(1))
    with pytest.raises(ResponseNotFound, match="evicted"):
        store.get("a", rid(1))


def test_reopen_keeps_records_and_lru_order(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path, max_responses=3)
    for n in (1, 2, 3):
        store.put(rec(n, f"s{n}"))
    for n, stamp in ((1, 300), (2, 100), (3, 200)):  # the order a run of reads leaves (mtimes)
        os.utime(tmp_path / f"{rid(n)}.json", ns=(stamp, stamp))
    again = ResponseStore(tmp_path, max_responses=3)
    assert again.get("a", rid(3)).response == rec(3).response
    again.put(rec(4, "s4"))  # the least recently used is rid(2)
    with pytest.raises(ResponseNotFound):
        again.get("a", rid(2))
    assert {again.get("a", rid(n)).id for n in (1, 3, 4)} == {rid(1), rid(3), rid(4)}


def test_damaged_files_are_refused_and_removed(tmp_path: Path) -> None:
    ResponseStore(tmp_path).put(rec(1))
    (tmp_path / f"{rid(2)}.json").write_bytes(b'{"id": "resp_')
    (tmp_path / f"{rid(3)}.json").write_bytes(b"{}")
    (tmp_path / f"{rid(4)}.tmp").write_bytes(b"half")
    with capture_logs() as logs:
        store = ResponseStore(tmp_path)
    assert sorted(e["path"] for e in logs if e["event"] == "responses.damaged") == [
        str(tmp_path / f"{rid(n)}.json") for n in (2, 3)
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{rid(1)}.json"]
    assert store.stats().responses == 1


def test_limits_are_checked() -> None:
    with pytest.raises(InvalidConfig):
        ResponseStore(max_responses=0)
    with pytest.raises(InvalidConfig):
        ResponseStore(max_bytes=True)


def test_reopen_with_lower_limits_evicts_the_oldest(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    for n, stamp in ((1, 100), (2, 300), (3, 200)):
        store.put(rec(n, f"s{n}"))
        os.utime(tmp_path / f"{rid(n)}.json", ns=(stamp, stamp))
    smaller = ResponseStore(tmp_path, max_responses=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{rid(2)}.json", f"{rid(3)}.json"]
    assert smaller.stats().responses == 2
