"""Per-key tenants on a real `turnstile serve --api-key-file` process: each key's `X-Session-Id` sessions
(made through /v1/messages with the `anthropic` client and /v1/chat/completions with the `openai` client)
are its own; another key gets 404 for every read and delete and an empty list; no key is 401 in each API's
shape; /metrics counts by key name; the store keeps the sessions apart; a damaged key file stops startup
with its line number."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from sessions import DiskStore
from tests.support.process import ServeProcess, ServeProcessError

ALICE, BOB = "sk-alice-0123", "sk-bob-4567"
ASK = [{"role": "user", "content": "Name a colour."}]


def keys(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return path


def h(key: str) -> dict[str, str]:
    return {"x-api-key": key}


async def test_each_key_sees_only_its_own_sessions(tiny_llama: Path, tmp_path: Path) -> None:
    key_file = keys(tmp_path, f"# the team\nalice: {ALICE}\n\nbob: {BOB}\n")
    data = tmp_path / "data"
    args = ["--model", tiny_llama, "--threads", "1", "--ctx", "1024", "--data-dir", data, "--api-key-file", key_file]
    with ServeProcess(*args) as srv:
        alice = AsyncAnthropic(base_url=srv.url, api_key=ALICE, max_retries=0)
        sid = {"X-Session-Id": "s1"}
        m = await alice.messages.create(model="t", max_tokens=4, messages=ASK, extra_headers=sid)  # type: ignore[arg-type]
        oai = AsyncOpenAI(base_url=srv.url + "/v1", api_key=ALICE, max_retries=0)
        await oai.chat.completions.create(model="t", messages=ASK, max_tokens=3, extra_headers={"X-Session-Id": "c1"})  # type: ignore[arg-type]
        async with httpx.AsyncClient(base_url=srv.url) as c:
            mine = await c.get("/v1/sessions/s1", headers=h(ALICE))
            assert mine.status_code == 200
            body = mine.json()
            assert (body["id"], body["object"], body["revision"]) == ("s1", "session", 1)
            assert [(x["role"], x["content"]) for x in body["messages"]] == [
                ("user", "Name a colour."),
                ("assistant", m.content[0].text),  # type: ignore[union-attr]
            ]
            listed = (await c.get("/v1/sessions", headers=h(ALICE))).json()
            assert listed == {
                "object": "list",
                "data": [{"id": "c1", "object": "session"}, {"id": "s1", "object": "session"}],
            }

            for method, path in (("GET", "/v1/sessions/s1"), ("DELETE", "/v1/sessions/s1"), ("GET", "/v1/sessions/c1")):
                r = await c.request(method, path, headers=h(BOB))
                assert r.status_code == 404, (method, path, r.text)
                assert r.json()["error"]["type"] == "not_found_error"
            assert (await c.get("/v1/sessions", headers={"Authorization": f"Bearer {BOB}"})).json()["data"] == []

            bob = AsyncAnthropic(base_url=srv.url, api_key=BOB, max_retries=0)
            other = [{"role": "user", "content": "Something else."}]
            await bob.messages.create(model="t", max_tokens=2, messages=other, extra_headers=sid)  # type: ignore[arg-type]
            theirs = (await c.get("/v1/sessions/s1", headers=h(BOB))).json()
            assert [x["content"] for x in theirs["messages"]][:1] == ["Something else."]
            assert (await c.get("/v1/sessions/s1", headers=h(ALICE))).json() == body  # untouched

            r = await c.post("/v1/messages", json={"max_tokens": 2, "messages": ASK})
            assert r.status_code == 401 and r.json()["type"] == "error"
            assert r.json()["error"] == {
                "type": "authentication_error",
                "message": "an API key is required (Authorization: Bearer KEY, or x-api-key: KEY)",
            }
            r = await c.post("/v1/chat/completions", json={"messages": ASK}, headers={"x-api-key": "sk-nobody"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"

            assert (await c.delete("/v1/sessions/s1", headers=h(ALICE))).json() == {
                "id": "s1",
                "object": "session.deleted",
                "deleted": True,
            }
            assert (await c.get("/v1/sessions/s1", headers=h(ALICE))).status_code == 404
            text = (await c.get("/metrics", headers=h(BOB))).text
        assert 'turnstile_http_responses_by_key_total{key="alice",status="200"}' in text
        assert 'turnstile_http_responses_by_key_total{key="bob",status="404"} 3' in text
        assert ALICE not in text and BOB not in text
    assert srv.returncode == 0
    store = DiskStore(data / "sessions")
    try:
        assert sorted(store.list()) == ["alice@c1", "bob@s1"]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("alice: sk-a\nbob: sk-a\n", "keys.txt:2: the same key is already on line 1"),
        ("\n\nbad name: k\n", "keys.txt:3:"),
    ],
)
def test_a_damaged_key_file_stops_startup_naming_the_line(
    tiny_llama: Path, tmp_path: Path, text: str, where: str
) -> None:
    srv = ServeProcess("--model", tiny_llama, "--api-key-file", keys(tmp_path, text))
    with pytest.raises(ServeProcessError):
        srv.start()
    assert srv.returncode == 2 and where in srv.stderr()
