"""/metrics reports the Responses store: stored responses and their bytes, in all and per API key name (never
the key), the limits, and evictions (in all and by the key name that made the evicted response). In-process
on the scripted backend; the numbers are checked against the store's own records."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.serve.http import app as make_app
from runtime.serve.http.responses_store import KeyStats, ResponseStore
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
