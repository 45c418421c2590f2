"""Quotas per API key (runtime.serve.http.quotas): each quota answers 429 with Retry-After in the dialect's
error shape, creates nothing, and moves its /metrics sample; the other key is untouched. In-process on the
scripted backend (the HTTP app is real; the quotas decide nothing a model would); the key file and the
command line are checked on the parser and on a real `turnstile serve --scripted` with the `openai` and
`anthropic` clients."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest
from anthropic import AsyncAnthropic, RateLimitError
from openai import AsyncOpenAI
from openai import RateLimitError as OpenAIRateLimit

from runtime import Runtime
from runtime.errors import InvalidConfig, InvalidKeyFile
from runtime.serve.http import app as make_app
from runtime.serve.http.quotas import Bucket, Quotas, parse_settings
from runtime.serve.http.responses.store import ResponseStore
from runtime.serve.http.tenants import Keyring, parse_key_file, parse_key_lines
from runtime.testing import ScriptedBackend
from sessions import MemoryStore
from tests.support.process import ServeProcess

pytestmark = pytest.mark.anyio

KEYS = {"alice": "sk-alice-secret-1", "bob": "sk-bob-secret-2"}
ASK = [{"role": "user", "content": "Name a colour."}]


def samples(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in re.finditer(rf"^turnstile_{name}(?:\{{(.*?)\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def h(key: str, sid: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[key]}", **({"X-Session-Id": sid} if sid else {})}


# --- settings ------------------------------------------------------------------------------------------


def test_settings_and_key_file_lines(tmp_path: Path) -> None:
    assert parse_settings(["sessions=3", "bytes=2K", "rpm=60", "weight=2"]) == {
        "sessions": 3,
        "bytes": 2048,
        "rpm": 60,
        "weight": 2,
    }
    for bad, why in (
        (["size=3"], "is not one of"),
        (["rpm=1K"], "whole number"),
        (["rpm=0"], ">= 1"),
        (["weight=5000"], "at most 1000"),
        (["rpm=1", "rpm=2"], "twice"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_settings(bad)
    path = tmp_path / "keys"
    path.write_text("alice: sk-a sessions=2 tpm=100 # the team\nbob: sk-b\nsk-c weight=3\n")
    assert parse_key_lines(path) == [
        (1, "alice", "sk-a", {"sessions": 2, "tpm": 100}),
        (2, "bob", "sk-b", {}),
        (3, "key3", "sk-c", {"weight": 3}),
    ]
    assert parse_key_file(path)[0] == (1, "alice", "sk-a")
    ring = Keyring.from_options(None, path, Quotas(sessions=10))
    assert ring.quotas("alice") == Quotas(sessions=2, tokens_per_min=100)
    assert ring.quotas("bob") == Quotas(sessions=10)
    assert ring.quotas("key3").weight == 3
    path.write_text("alice: sk-a sessions=2\nbob: sk-b rpm=x\n")
    with pytest.raises(InvalidKeyFile, match=r"keys:2: 'rpm=x'"):
        parse_key_lines(path)
    with pytest.raises(InvalidConfig):
        Quotas(queued=0)


def test_bucket_refills_per_minute_and_goes_into_debt() -> None:
    now = [0.0]
    b = Bucket(60, clock=lambda: now[0])
    assert b.wait_for(1) == 0 and b.used() == 0
    b.take(90)  # a request that cost more than the bucket held: 30 in debt
    assert b.used() == 90 and b.wait_for(1) == pytest.approx(31.0)
    now[0] = 31.0
    assert b.wait_for(1) == 0 and b.used() == 59
    now[0] = 1000.0
    assert b.used() == 0  # full again, never above capacity


# --- in process ----------------------------------------------------------------------------------------


Served = tuple[httpx.AsyncClient, ScriptedBackend, Runtime]


@asynccontextmanager
async def serving(alice: dict[str, int]) -> AsyncIterator[Served]:
    """The app with keys alice (quotas from `alice`'s settings) and bob (none), on the scripted backend."""
    keyring = Keyring(KEYS.items(), quotas={"alice": Quotas().with_settings(alice)})
    backend = ScriptedBackend()
    async with Runtime.serve(backend, MemoryStore()) as rt:
        transport = httpx.ASGITransport(app=make_app(rt, keyring=keyring, responses=ResponseStore()))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c, backend, rt


async def metrics(c: httpx.AsyncClient) -> str:
    r = await c.get("/metrics", headers=h("bob"))
    assert r.status_code == 200
    return r.text


def usage(text: str, quota: str, key: str = "alice") -> float:
    return samples(text, "key_usage")[f'key="{key}",quota="{quota}"']


def assert_429(r: httpx.Response, code: str, *, anthropic: bool = False) -> int:
    assert r.status_code == 429, r.text
    if anthropic:
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "rate_limit_error"
    else:
        assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == code
    return int(r.headers["retry-after"])


async def test_sessions_quota() -> None:
    async with serving({"sessions": 1}) as (c, _, rt):
        chat = {"messages": ASK}
        assert (await c.post("/v1/chat/completions", json=chat, headers=h("alice", "s1"))).status_code == 200
        assert usage(await metrics(c), "sessions") == 1
        assert (
            assert_429(
                await c.post("/v1/chat/completions", json=chat, headers=h("alice", "s2")), "sessions_quota_exceeded"
            )
            == 60
        )
        msg = {"max_tokens": 5, "messages": ASK}
        assert_429(await c.post("/v1/messages", json=msg, headers=h("alice", "s3")), "", anthropic=True)
        r = await c.post("/v1/responses", json={"input": "hi"}, headers=h("alice"))  # store: a new session
        assert_429(r, "sessions_quota_exceeded")
        assert sorted(await rt.list_sessions()) == ["alice@s1"]  # nothing created
        # what stores nothing new still runs: the session it has, a stateless turn, an unstored response
        assert (await c.post("/v1/chat/completions", json=chat, headers=h("alice", "s1"))).status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat, headers=h("alice"))).status_code == 200
        r = await c.post("/v1/responses", json={"input": "hi", "store": False}, headers=h("alice"))
        assert r.status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat, headers=h("bob", "s2"))).status_code == 200  # bob: free
        text = await metrics(c)
        assert usage(text, "sessions") == 1
        assert 'key="bob",quota="sessions"' not in samples(text, "key_usage")  # no quota on it: not counted
        assert samples(text, "key_limit")['key="alice",quota="sessions"'] == 1
        assert samples(text, "key_rejected_total") == {'key="alice",quota="sessions"': 3}
        # a deleted session makes room
        assert (await c.delete("/v1/sessions/s1", headers=h("alice"))).status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat, headers=h("alice", "s2"))).status_code == 200


async def test_stored_bytes_quota() -> None:
    async with serving({"bytes": 300}) as (c, _, rt):
        long = [{"role": "user", "content": "x" * 400}]
        assert (
            await c.post("/v1/chat/completions", json={"messages": long}, headers=h("alice", "s1"))
        ).status_code == 200
        exported = len(await rt.export("alice@s1"))
        r = await c.post("/v1/chat/completions", json={"messages": ASK}, headers=h("alice", "s2"))
        assert_429(r, "bytes_quota_exceeded")
        assert_429(await c.post("/v1/responses", json={"input": "hi"}, headers=h("alice")), "bytes_quota_exceeded")
        assert await rt.list_sessions() == ["alice@s1"]
        assert usage(await metrics(c), "bytes") == exported  # sessions (as exported) + responses (none)
        # stateless work stores nothing: allowed
        assert (await c.post("/v1/chat/completions", json={"messages": ASK}, headers=h("alice"))).status_code == 200
        assert (await c.post("/v1/responses", json={"input": "x" * 400}, headers=h("bob"))).status_code == 200


async def test_queued_quota() -> None:
    async with serving({"queued": 1}) as (c, backend, rt):
        gate = backend.hold("alice@busy")
        chat = {"messages": ASK}
        async with anyio.create_task_group() as tg:
            first: list[httpx.Response] = []

            async def hold() -> None:
                first.append(await c.post("/v1/chat/completions", json=chat, headers=h("alice", "busy")))

            tg.start_soon(hold)
            await gate.arrived()  # alice's one request in flight is running
            assert usage(await metrics(c), "queued") == 1
            assert (
                assert_429(
                    await c.post("/v1/chat/completions", json=chat, headers=h("alice", "s2")), "queued_quota_exceeded"
                )
                == 1
            )
            r = await c.post("/v1/messages", json={"max_tokens": 3, "messages": ASK}, headers=h("alice"))
            assert_429(r, "", anthropic=True)
            bob: list[httpx.Response] = []

            async def bobs() -> None:  # bob's quota is his own: queued behind alice's turn, not refused
                bob.append(await c.post("/v1/chat/completions", json=chat, headers=h("bob", "s2")))

            tg.start_soon(bobs)
            while rt.stats().scheduler.queued < 1:
                await anyio.sleep(0.001)  # bob's request is in the queue
            gate.open()
        assert bob[0].status_code == 200 and first[0].status_code == 200
        assert sorted(await rt.list_sessions()) == ["alice@busy", "bob@s2"]
        text = await metrics(c)
        assert usage(text, "queued") == 0
        assert samples(text, "key_rejected_total") == {'key="alice",quota="queued"': 2}


async def test_requests_per_minute() -> None:
    async with serving({"rpm": 2}) as (c, _, rt):
        chat = {"messages": ASK}
        for sid in ("s1", "s2"):
            assert (await c.post("/v1/chat/completions", json=chat, headers=h("alice", sid))).status_code == 200
        wait = assert_429(
            await c.post("/v1/chat/completions", json=chat, headers=h("alice", "s3")), "rpm_quota_exceeded"
        )
        assert 25 <= wait <= 30  # one request back every 30 s
        assert sorted(await rt.list_sessions()) == ["alice@s1", "alice@s2"]
        assert (await c.get("/v1/sessions", headers=h("alice"))).status_code == 200  # only turns are counted
        assert (await c.post("/v1/chat/completions", json=chat, headers=h("bob"))).status_code == 200
        text = await metrics(c)
        assert usage(text, "rpm") == 2 and samples(text, "key_limit")['key="alice",quota="rpm"'] == 2


async def test_tokens_per_minute() -> None:
    async with serving({"tpm": 10}) as (c, _, rt):
        r = await c.post("/v1/chat/completions", json={"messages": ASK}, headers=h("alice", "s1"))
        assert r.status_code == 200
        spent = r.json()["usage"]["prompt_tokens"] + r.json()["usage"]["completion_tokens"]
        assert spent > 10
        assert usage(await metrics(c), "tpm") == spent  # prefilled + generated: nothing was cached
        r = await c.post("/v1/responses", json={"input": "hi"}, headers=h("alice"))
        wait = assert_429(r, "tpm_quota_exceeded")  # in debt: until one token is back at 10 a minute
        assert (spent - 9) * 6 - 2 <= wait <= (spent - 9) * 6
        assert await rt.list_sessions() == ["alice@s1"]
        assert (await c.post("/v1/chat/completions", json={"messages": ASK}, headers=h("bob"))).status_code == 200


async def test_max_tokens_ceiling() -> None:
    async with serving({"max_tokens": 2}) as (c, _, rt):
        long_reply = {"messages": [{"role": "user", "content": "one two three four five"}]}
        r = await c.post("/v1/chat/completions", json=long_reply, headers=h("alice"))
        # the ceiling is the default (the scripted backend's tokens are characters, its max_tokens counts words)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["choices"][0]["message"]["content"] == "echo: one"
        r = await c.post("/v1/chat/completions", json={**long_reply, "max_tokens": 3}, headers=h("alice", "s1"))
        assert r.status_code == 400 and r.json()["error"]["code"] == "max_tokens_over_quota"
        r = await c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 50}, headers=h("alice"))
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"
        r = await c.post("/v1/messages", json={"max_tokens": 9, "messages": ASK}, headers=h("alice"))
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert await rt.list_sessions() == []
        r = await c.post("/v1/chat/completions", json=long_reply, headers=h("bob"))
        assert r.json()["choices"][0]["message"]["content"] == "echo: one two three four five"
        assert samples(await metrics(c), "key_limit")['key="alice",quota="max_tokens"'] == 2


# --- a real server, real clients -------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # one real server is enough
async def test_quota_from_the_command_line_and_key_file_with_real_clients(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"alice: {KEYS['alice']} sessions=1\nbob: {KEYS['bob']}\n")
    with ServeProcess("--scripted", "--api-key-file", keys, "--quota", "rpm=3") as srv:
        oai = AsyncOpenAI(base_url=srv.url + "/v1", api_key=KEYS["alice"], max_retries=0)
        await oai.chat.completions.create(model="t", messages=ASK, extra_headers={"X-Session-Id": "a"})  # type: ignore[arg-type]
        with pytest.raises(OpenAIRateLimit) as over:
            await oai.chat.completions.create(model="t", messages=ASK, extra_headers={"X-Session-Id": "b"})  # type: ignore[arg-type]
        assert over.value.response.headers["retry-after"] == "60"
        ant = AsyncAnthropic(base_url=srv.url, api_key=KEYS["bob"], max_retries=0)
        for _ in range(3):  # bob: the command line's rpm=3, no sessions quota
            await ant.messages.create(model="t", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
        with pytest.raises(RateLimitError) as limited:
            await ant.messages.create(model="t", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
        assert limited.value.body == {  # Anthropic's shape
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "the key is over its 3 requests per minute"},
        }
        async with httpx.AsyncClient(base_url=srv.url) as c:
            text = (await c.get("/metrics", headers={"x-api-key": KEYS["bob"]})).text
        assert samples(text, "key_limit")['key="alice",quota="sessions"'] == 1
        assert samples(text, "key_limit")['key="bob",quota="rpm"'] == 3
        assert samples(text, "key_rejected_total") == {'key="alice",quota="sessions"': 1, 'key="bob",quota="rpm"': 1}


def test_bad_quota_stops_the_command(tmp_path: Path) -> None:
    from tests.support.process import ServeProcessError

    with pytest.raises(ServeProcessError, match="--quota"), ServeProcess("--scripted", "--quota", "rpm=fast"):
        pass
