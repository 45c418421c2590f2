"""GET /v1/engine/events on a real server (uvicorn, tiny llama model, two API keys): each key sees its own
sessions by name and another key's request only anonymously; an idle server sends nothing more."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx

from runtime import Runtime
from runtime.loop.engine_view import EngineView, Running, Tier, Waiting
from runtime.serve.http.engine_events import INTERVAL, for_tenant
from runtime.serve.http.tenants import Keyring, Tenant
from tests.support.uvicorn_server import uvicorn_server

KEYS = Keyring([("alice", "key-alice"), ("bob", "key-bob")])
LONG = {"max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True}  # seconds: cut short


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Feed:
    """One key's engine event stream: the raw bytes received and the parsed events."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self.lines = lines
        self.raw: list[str] = []

    async def next(self) -> dict[str, Any]:
        name, data = "", ""
        async for line in self.lines:
            self.raw.append(line)
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and data:
                assert name == "engine"
                event: dict[str, Any] = json.loads(data)
                return event
        raise AssertionError("the stream ended")

    async def until(self, check: Any) -> dict[str, Any]:
        with anyio.fail_after(60):
            while not check(event := await self.next()):
                pass
        return event


@asynccontextmanager
async def feed(client: httpx.AsyncClient, url: str, key: str) -> AsyncIterator[Feed]:
    async with client.stream("GET", url + "/v1/engine/events", headers=auth(key), timeout=None) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        yield Feed(r.aiter_lines())


async def test_key_b_receives_nothing_about_key_a_sessions(tiny_llama: Path) -> None:
    def open_runtime() -> Any:
        return Runtime.open(tiny_llama, n_ctx=4096, n_threads=1)

    async with uvicorn_server(open_runtime, keyring=KEYS) as url, httpx.AsyncClient() as c:
        assert (await c.get(url + "/v1/engine/events")).status_code == 401
        async with feed(c, url, "key-alice") as alice, feed(c, url, "key-bob") as bob:
            first = await bob.next()  # the snapshot on connecting, idle
            assert first["running"] is None and first["queue"] == [] and first["sessions"] == {}
            assert first["busy"] is False
            await alice.next()
            body = {"model": "t", "messages": [{"role": "user", "content": "Hello"}], **LONG}
            headers = {**auth("key-alice"), "X-Session-Id": "secret-a"}
            async with c.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
                assert r.status_code == 200
                mine = await alice.until(lambda e: (e["running"] or {}).get("phase") == "decoding")
                assert mine["running"]["own"] is True and mine["running"]["session"] == "secret-a"
                assert mine["running"]["total"] > 0 and mine["running"]["done"] == mine["running"]["total"]
                assert mine["running"]["generated"] > 0
                theirs = await bob.until(lambda e: e["running"] is not None)
                assert theirs["running"] == {"own": False, "kind": "complete", "phase": theirs["running"]["phase"]}
            # alice left mid-stream: the turn is cancelled
            after = await alice.until(lambda e: not e["busy"] and e["running"] is None)
            assert after["sessions"] == {"secret-a": "slot"}  # where its tokens are (the turn left no commit)
            idle = await bob.until(lambda e: not e["busy"] and e["running"] is None)
            assert idle["sessions"] == {}
            # idle: nothing more arrives (several intervals)
            with anyio.move_on_after(INTERVAL * 6) as quiet:
                await bob.next()
            assert quiet.cancelled_caught
        text = "\n".join(bob.raw)
        assert "secret-a" not in text and "alice" not in text
        assert '"own":false' in text and '"own":true' not in text
        assert "secret-a" in "\n".join(alice.raw)


def test_for_tenant_names_only_the_key_own_sessions() -> None:
    view = EngineView(
        queue=[
            Waiting(request_id=3, session_id="alice@a1", kind="chat", waited=0.5),
            Waiting(request_id=4, session_id="bob@b1", kind="chat", waited=0.25),
            Waiting(request_id=5, session_id="@stateless:7", kind="complete", waited=0.125),
        ],
        running=Running(
            request_id=2, session_id="bob@b2", kind="chat", phase="prefill", elapsed=1.0, cached=5, done=9, total=20
        ),
        ram=Tier(entries=2, bytes=100, stored=80, limit=None),
        disk=None,
        shared_blocks=64,
        slot_tokens=9,
        locations={"alice@a1": "ram", "bob@b2": "slot", "bob@b1": "disk"},
        busy=True,
    )
    alice = for_tenant(view, Tenant("alice", "alice@"))
    assert alice["queue"] == [
        {"own": True, "session": "a1", "request_id": 3, "kind": "chat", "waited": 0.5},
        {"own": False, "kind": "chat"},
        {"own": False, "kind": "complete"},
    ]
    assert alice["running"] == {"own": False, "kind": "chat", "phase": "prefill"}
    assert alice["sessions"] == {"a1": "ram"}
    assert alice["ram"] == {"entries": 2, "bytes": 100, "stored": 80, "limit": None, "blocks": None}
    bob = for_tenant(view, Tenant("bob", "bob@"))
    assert bob["running"]["session"] == "b2" and bob["running"]["done"] == 9
    assert bob["sessions"] == {"b1": "disk", "b2": "slot"}
    assert "a1" not in json.dumps(bob)
    # one tenant (no keys): every session is the key's own, a stateless request still anonymous
    solo = for_tenant(view, Tenant("default"))
    assert [w["own"] for w in solo["queue"]] == [True, True, False]
    assert solo["queue"][0]["session"] == "alice@a1"
