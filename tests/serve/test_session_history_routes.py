"""The history routes the web page uses (create, fork, undo, rename, export, import) and POST /v1/rooms, on a
real server (uvicorn, tiny llama model, two API keys): each key works only in its own namespace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.serve.http.errors import ApiError
from runtime.serve.http.rooms import plan
from runtime.serve.http.tenants import Keyring
from runtime.testing.scripted import Pause, ScriptedBackend
from sessions import MemoryStore
from tests.support.uvicorn_server import uvicorn_server

KEYS = Keyring([("alice", "key-alice"), ("bob", "key-bob")])
A = {"Authorization": "Bearer key-alice"}
B = {"Authorization": "Bearer key-bob"}


def server(model: Path) -> Any:
    return uvicorn_server(lambda: Runtime.open(model, n_ctx=1024, n_threads=1), keyring=KEYS)


async def chat(c: httpx.AsyncClient, url: str, sid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "t", "messages": messages, "max_tokens": 4, "temperature": 0}
    r = await c.post(url + "/v1/chat/completions", json=body, headers={**A, "X-Session-Id": sid})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def history(c: httpx.AsyncClient, url: str, sid: str, key: dict[str, str] = A) -> list[tuple[str, str]]:
    r = await c.get(f"{url}/v1/sessions/{sid}", headers=key)
    assert r.status_code == 200, r.text
    return [(m["role"], m["content"]) for m in r.json()["messages"]]


async def test_history_operations_stay_in_the_key_namespace(tiny_llama: Path) -> None:
    async with server(tiny_llama) as url, httpx.AsyncClient(timeout=60) as c:
        r = await c.post(
            url + "/v1/sessions", json={"id": "s", "system": "Be brief.", "sampling": {"temperature": 0}}, headers=A
        )
        assert r.status_code == 201 and r.json()["id"] == "s" and r.json()["revision"] == 0
        assert (await c.post(url + "/v1/sessions", json={"id": "s"}, headers=A)).status_code == 409
        bad = await c.post(url + "/v1/sessions", json={"id": "x", "sampling": {"temperature": "hot"}}, headers=A)
        assert bad.status_code == 400
        assert (
            await c.post(url + "/v1/sessions", json={"id": "x", "sampling": {"nope": 1}}, headers=A)
        ).status_code == 400
        assert (await c.get(url + "/v1/sessions/x", headers=A)).status_code == 404  # nothing was created
        one = await chat(c, url, "s", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        said = one["choices"][0]["message"]["content"]
        assert await history(c, url, "s") == [("system", "Be brief."), ("user", "Hi"), ("assistant", said)]

        r = await c.post(url + "/v1/sessions/s/fork", json={"id": "s2"}, headers=A)
        assert r.status_code == 201 and r.json()["id"] == "s2"
        assert await history(c, url, "s2") == await history(c, url, "s")
        r = await c.post(url + "/v1/sessions/s2/undo", json={}, headers=A)
        assert r.status_code == 200 and await history(c, url, "s2") == [("system", "Be brief.")]
        r = await c.post(url + "/v1/sessions/s2/rename", json={"id": "s3"}, headers=A)
        assert r.status_code == 200 and r.json()["id"] == "s3"
        assert (await c.get(url + "/v1/sessions/s2", headers=A)).status_code == 404

        exported = (await c.get(url + "/v1/sessions/s/export", headers=A)).json()
        assert exported["id"] == "s"  # the client's id, never alice@s
        assert "alice" not in json.dumps(exported)
        # bob imports alice's file under the same name: it is his own copy, alice's session is untouched
        r = await c.post(url + "/v1/sessions/import", json={"id": "s", "data": exported}, headers=B)
        assert r.status_code == 201, r.text
        assert await history(c, url, "s", B) == await history(c, url, "s")
        assert (
            await c.post(url + "/v1/sessions/import", json={"id": "s", "data": exported}, headers=B)
        ).status_code == 409
        assert (
            await c.post(url + "/v1/sessions/import", json={"id": "t", "data": "nope"}, headers=B)
        ).status_code == 400
        await c.post(url + "/v1/sessions/s/undo", json={"n": 1}, headers=B)
        assert len(await history(c, url, "s")) == 3 and len(await history(c, url, "s", B)) == 1
        # bob cannot reach alice's sessions by any route
        for path in ("/v1/sessions/s3/fork", "/v1/sessions/s3/undo", "/v1/sessions/s3/rename"):
            assert (await c.post(url + path, json={"id": "mine"}, headers=B)).status_code == 404
        assert (await c.get(url + "/v1/sessions/s3/export", headers=B)).status_code == 404
        assert (await c.post(url + "/v1/sessions/s3/fork", json={"id": "z"}, headers={})).status_code == 401
        listed = (await c.get(url + "/v1/sessions", headers=B)).json()["data"]
        assert [s["id"] for s in listed] == ["s"]


async def test_room_streams_each_agent_turn_in_order(tiny_llama: Path) -> None:
    async with server(tiny_llama) as url, httpx.AsyncClient(timeout=120) as c:
        body = {"topic": "bridges", "agents": 3, "rounds": 2, "max_tokens": 3, "temperature": 0}
        events: list[tuple[str, dict[str, Any]]] = []
        async with c.stream("POST", url + "/v1/rooms", json=body, headers=A) as r:
            assert r.status_code == 200
            name = ""
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
        kinds = [k for k, _ in events]
        assert kinds[0] == "room" and kinds[-1] == "end" and events[-1][1] == {"turns": 6}
        room = events[0][1]
        agents = [a["name"] for a in room["agents"]]
        assert agents == ["historian", "engineer", "poet"]
        turns = [e for k, e in events if k == "turn"]
        assert [(t["round"], t["agent"]) for t in turns] == [(r, a) for r in (1, 2) for a in agents]
        done = [e for k, e in events if k == "done"]
        assert [d["index"] for d in done] == list(range(6))
        assert all(d["stats"]["generated"] == 3 for d in done)
        assert all(d["stats"]["cached"] > 0 for d in done[3:])  # an agent's second turn reuses its first
        sessions = sorted(s["id"] for s in (await c.get(url + "/v1/sessions", headers=A)).json()["data"])
        assert sessions == sorted(a["session"] for a in room["agents"])
        assert (await c.get(url + "/v1/sessions", headers=B)).json()["data"] == []
        r = await c.post(url + "/v1/rooms", json={"topic": "", "agents": 3}, headers=A)
        assert r.status_code == 400 and r.json()["error"]["param"] == "topic"


@pytest.mark.parametrize(
    "body",
    [
        {"topic": "x", "agents": 0},
        {"topic": "x", "agents": 7},
        {"topic": "x", "rounds": 6},
        {"topic": "x", "mode": "brawl"},
        {"topic": "x", "personas": [{"name": "a b", "system": "s"}]},
        {"topic": "x", "personas": [{"name": "a", "system": "s"}, {"name": "a", "system": "t"}]},
        {"topic": "x", "max_tokens": True},
        [1],
    ],
)
def test_room_plan_refuses_bad_input(body: Any) -> None:
    with pytest.raises(ApiError) as e:
        plan(body)
    assert e.value.status == 400


def test_room_plan_personas_and_debate() -> None:
    p = plan({"topic": " cats ", "mode": "debate", "agents": 2, "seed": 3})
    assert [x.name for x in p.personas] == ["advocate", "critic"] and p.topic == "cats" and p.sampling["seed"] == 3
    p = plan({"topic": "dogs", "personas": [{"name": "a", "system": "You are A."}]})
    assert [(x.name, x.system) for x in p.personas] == [("a", "You are A.")]


async def test_closing_the_room_stream_cancels_the_turn_in_progress() -> None:
    """A scripted backend paused after the first agent's first piece: the client leaves, the turn is withdrawn
    (nothing committed) and no other agent speaks."""
    backend = ScriptedBackend(lambda _m: "one two three four")
    backend.pause = Pause(after=1)
    runtimes: list[Runtime] = []

    @asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        async with Runtime.serve(backend, MemoryStore()) as rt:
            runtimes.append(rt)
            yield rt

    async with uvicorn_server(open_runtime, keyring=KEYS) as url, httpx.AsyncClient(timeout=60) as c:
        rt = runtimes[0]
        body = {"topic": "tea", "agents": 3, "rounds": 2}
        async with c.stream("POST", url + "/v1/rooms", json=body, headers=A) as r:
            assert r.status_code == 200
            seen: list[str] = []
            async for line in r.aiter_lines():
                seen.append(line)
                if line.startswith("event: delta"):
                    break
        with anyio.fail_after(30):  # the server notices the client left: the running job is withdrawn
            while not ((job := rt.scheduler.running) is not None and job.cancelled):
                await anyio.sleep(0.005)
        backend.pause.go()
        with anyio.fail_after(30):
            while rt.scheduler.busy:
                await anyio.sleep(0.005)
        sessions = [s["id"] for s in (await c.get(url + "/v1/sessions", headers=A)).json()["data"]]
        assert len(sessions) == 3 and len(backend.runs) == 1  # one turn started, none after it
        for sid in sessions:  # each agent's session holds only its persona
            assert [role for role, _ in await history(c, url, sid)] == ["system"]
        assert rt.stats().scheduler.cancelled == 1
