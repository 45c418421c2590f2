"""/metrics reports the Responses store: stored responses and their bytes, in all and per API key name (never
the key), the limits, and evictions (in all and by the key name that made the evicted response). In-process
on the scripted backend; the numbers are checked against the store's own records."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.serve.http import app as make_app
from runtime.serve.http.responses.store import KeyStats, Record, ResponseStore
from runtime.serve.http.tenants import Keyring
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

pytestmark = pytest.mark.anyio

KEYS = {"alice": "sk-alice-secret-1", "bob": "sk-bob-secret-2"}


def echo(messages: Sequence[dict[str, Any]]) -> str:
    return f"re: {messages[-1].get('content', '')}"


def samples(text: str, name: str) -> dict[str, float]:
    """`{labels: value}` of one metric ("" for no labels)."""
    out: dict[str, float] = {}
    for m in re.finditer(rf"^turnstile_{name}(?:\{{(.*?)\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


async def test_metrics_count_stored_responses_bytes_and_evictions_per_key_name() -> None:
    store = ResponseStore(max_responses=3)
    keyring = Keyring(KEYS.items())
    async with Runtime.serve(ScriptedBackend(echo), MemoryStore()) as rt:
        transport = httpx.ASGITransport(app=make_app(rt, keyring=keyring, responses=store))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:

            async def create(key: str, text: str, **body: Any) -> dict[str, Any]:
                headers = {"Authorization": f"Bearer {KEYS[key]}"}
                r = await c.post("/v1/responses", json={"input": text, **body}, headers=headers)
                assert r.status_code == 200, r.text
                out: dict[str, Any] = r.json()
                return out

            async def scrape() -> str:
                r = await c.get("/metrics", headers={"Authorization": f"Bearer {KEYS['alice']}"})
                assert r.status_code == 200
                return r.text

            empty = await scrape()
            assert samples(empty, "stored_responses") == {"": 0}
            assert samples(empty, "stored_responses_by_key") == {}
            first = await create("alice", "one")
            await create("alice", "two")
            await create("bob", "three", store=False)  # kept nowhere
            await create("bob", "four")
            mid = store.stats()
            assert mid.by_key == {
                "alice": KeyStats(responses=2, bytes=mid.by_key["alice"].bytes),
                "bob": KeyStats(responses=1, bytes=mid.by_key["bob"].bytes),
            }
            await create("bob", "five")  # the fourth stored: alice's oldest goes
            gone = await c.get(f"/v1/responses/{first['id']}", headers={"Authorization": f"Bearer {KEYS['alice']}"})
            assert gone.status_code == 404
            text = await scrape()
    st = store.stats()
    assert (st.responses, st.evicted) == (3, 1)
    assert st.by_key["alice"].responses == 1 and st.by_key["bob"].responses == 2
    assert st.by_key["alice"].bytes + st.by_key["bob"].bytes == st.bytes > 0
    assert samples(text, "stored_responses") == {"": 3}
    assert samples(text, "stored_response_bytes") == {"": st.bytes}
    assert samples(text, "stored_response_evictions_total") == {"": 1}
    assert samples(text, "stored_response_limit") == {'kind="responses"': 3, 'kind="bytes"': st.max_bytes}
    assert samples(text, "stored_responses_by_key") == {'key="alice"': 1, 'key="bob"': 2}
    assert samples(text, "stored_response_bytes_by_key") == {
        'key="alice"': st.by_key["alice"].bytes,
        'key="bob"': st.by_key["bob"].bytes,
    }
    assert samples(text, "stored_response_evictions_by_key_total") == {'key="alice"': 1, 'key="bob"': 0}
    assert store.gauges() == st
    assert not any(key in text for key in KEYS.values())


def test_per_key_counts_follow_put_delete_and_reopen(tmp_path: Path) -> None:
    def rec(n: int, tenant: str) -> Record:
        rid = f"resp_{n:048x}"
        return Record(id=rid, tenant=tenant, session=f"s{n}", upto=2, response={"id": rid, "pad": "x" * n}, items=[])

    def size(n: int) -> int:
        return (tmp_path / f"resp_{n:048x}.json").stat().st_size

    store = ResponseStore(tmp_path, max_responses=10)
    for n, tenant in ((1, "a"), (2, "b"), (3, "a"), (4, "b")):
        store.put(rec(n, tenant))
    store.delete("b", f"resp_{2:048x}")
    want = {"a": KeyStats(responses=2, bytes=size(1) + size(3)), "b": KeyStats(responses=1, bytes=size(4))}
    assert store.stats().by_key == store.gauges().by_key == want
    os.utime(tmp_path / f"resp_{1:048x}.json", ns=(1, 1))  # the oldest file: evicted first at the reopen
    smaller = ResponseStore(tmp_path, max_responses=2)
    st = smaller.stats()
    assert st.by_key == {
        "a": KeyStats(responses=1, bytes=size(3), evicted=1),
        "b": KeyStats(responses=1, bytes=size(4)),
    }
    assert (st.responses, st.bytes, st.evicted) == (2, size(3) + size(4), 1) and smaller.gauges() == st
