"""The affinity routing rules (routing key, rendezvous order with bounded load) and the ASGI relay between
the ingress and a replica, without Ray: the relay runs the real HTTP app over a scripted Runtime."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from runtime.api import Runtime
from runtime.errors import InvalidConfig
from runtime.serve.cluster.affinity import Placements, conversation_key, order, routing_key, score
from runtime.serve.cluster.relay import REPLICA_HEADER, Forwarder, drive, forwarded_scope
from runtime.serve.http import app as make_app
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "hi"}


def body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"messages": messages, **extra}).encode()


# --- routing key -----------------------------------------------------------------------------------


def test_key_is_the_session_header_then_the_user_field() -> None:
    assert routing_key("s1", body([USER], user="u")) == "session:s1"
    assert routing_key(None, body([USER], user="u")) == "session:u"
    assert routing_key("", body([USER], user="u")) == "session:u"


def test_key_of_a_stateless_conversation_stays_as_its_history_grows() -> None:
    first = routing_key(None, body([SYSTEM, USER]))
    later = [SYSTEM, USER, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert routing_key(None, body(later, temperature=0)) == first
    assert first == conversation_key([SYSTEM, USER])
    assert first.startswith("conv:")


def test_key_differs_by_system_prompt_and_first_question() -> None:
    base = routing_key(None, body([SYSTEM, USER]))
    assert routing_key(None, body([{"role": "system", "content": "You are verbose."}, USER])) != base
    assert routing_key(None, body([SYSTEM, {"role": "user", "content": "bye"}])) != base
    assert routing_key(None, body([USER])) != base


def test_key_of_a_body_that_is_no_chat_request() -> None:
    assert routing_key(None, b"not json") == routing_key(None, b"not json")
    assert routing_key(None, b"not json").startswith("body:")
    assert routing_key(None, b"{}").startswith("body:")
    assert routing_key(None, b"not json") != routing_key(None, b"{}")


# --- order ---------------------------------------------------------------------------------------


def test_order_is_rendezvous_hashing() -> None:
    loads = {"a": 0, "b": 0, "c": 0}
    for i in range(50):
        key = f"conv:{i}"
        assert order(key, loads) == sorted(loads, key=lambda r: score(key, r), reverse=True)
    assert order("k", {}) == []


def test_losing_a_replica_moves_only_its_keys() -> None:
    keys = [f"conv:{i}" for i in range(300)]
    before = {k: order(k, {"a": 0, "b": 0, "c": 0})[0] for k in keys}
    after = {k: order(k, {"a": 0, "b": 0})[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved == [k for k in keys if before[k] == "c"]
    assert 60 < len(moved) < 140  # about a third
    grown = {k: order(k, {"a": 0, "b": 0, "c": 0, "d": 0})[0] for k in keys}
    assert all(grown[k] in (before[k], "d") for k in keys)  # a new replica takes keys only for itself


def test_a_busy_replica_spills_to_the_next_choice() -> None:
    key = next(f"conv:{i}" for i in range(100) if order(f"conv:{i}", {"a": 0, "b": 0})[0] == "a")
    assert order(key, {"a": 2, "b": 0}) == ["a", "b"]  # bound max(1.25 * 3 / 2, 0 + 2) = 2: a stays first
    assert order(key, {"a": 3, "b": 0}) == ["b", "a"]  # bound max(1.25 * 4 / 2, 2) = 2.5: a spills
    assert order(key, {"a": 3, "b": 1}) == ["a", "b"]  # bound max(3.125, 3)
    assert order(key, {"a": 4, "b": 1}) == ["b", "a"]  # bound max(3.75, 3)
    assert order(key, {"a": 3, "b": 0}, slack=3) == ["a", "b"]
    assert order(key, {"a": 50}) == ["a"]  # one replica takes everything


def test_the_last_replica_of_a_key_comes_first_unless_busy() -> None:
    key = next(f"conv:{i}" for i in range(100) if order(f"conv:{i}", {"a": 0, "b": 0, "c": 0})[0] == "a")
    rest = [r for r in order(key, {"a": 0, "b": 0, "c": 0}) if r != "c"]
    assert order(key, {"a": 0, "b": 0, "c": 0}, last="c") == ["c", *rest]
    assert order(key, {"a": 0, "b": 0, "c": 5}, last="c")[-1] == "c"
    assert order(key, {"a": 0, "b": 0}, last="gone") == order(key, {"a": 0, "b": 0})


def test_placements_forget_the_oldest_keys_and_dead_replicas() -> None:
    p = Placements(2)
    p.put("k1", "a")
    p.put("k2", "b")
    p.put("k1", "a")  # k1 is now the most recent
    p.put("k3", "a")
    assert (p.get("k1"), p.get("k2"), p.get("k3"), len(p)) == ("a", None, "a", 2)
    p.forget_replica("a")
    assert (p.get("k1"), p.get("k3"), len(p)) == (None, None, 0)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidConfig):
            Placements(bad)  # type: ignore[arg-type]


# --- relay ---------------------------------------------------------------------------------------


def http_scope(path: str, headers: list[Any], method: str = "POST") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "/ignored",
        "query_string": b"",
        "headers": headers,
        "client": ["127.0.0.1", 5000],
        "server": ("127.0.0.1", 8000),
        "state": {"not": "forwarded"},
    }


class Client:
    """An ASGI client for one request: the body once, then (when told) a disconnect; collects what is sent."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.sent: list[dict[str, Any]] = []
        self._given = False

    async def receive(self) -> dict[str, Any]:
        if not self._given:
            self._given = True
            return {"type": "http.request", "body": self.data, "more_body": False}
        import anyio

        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    def json(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


class ReplicaDied(Exception):
    """Stands for Ray's RayActorError in the forwarder's retry."""


async def test_forwarder_routes_by_key_and_retries_a_call_that_failed_before_answering() -> None:
    async with Runtime.serve(ScriptedBackend(), MemoryStore()) as rt:
        app = make_app(rt)
        calls: list[tuple[str, dict[str, Any]]] = []

        async def call(key: str, scope: dict[str, Any], data: bytes) -> AsyncIterator[list[dict[str, Any]]]:
            calls.append((key, scope))
            if len(calls) == 1:
                raise ReplicaDied
            async for batch in drive(app, scope, data, f"r{len(calls)}"):
                yield batch

        fwd = Forwarder(call, max_body_bytes=1 << 20, retryable=(ReplicaDied,))
        client = Client(body([SYSTEM, USER], max_tokens=5))
        await fwd(
            http_scope("/v1/chat/completions", [(b"content-type", b"application/json")]), client.receive, client.send
        )
        assert client.status == 200
        assert client.headers[REPLICA_HEADER] == b"r2"
        assert client.json()["choices"][0]["message"]["content"] == "echo: hi"
        assert [k for k, _ in calls] == [conversation_key([SYSTEM, USER])] * 2
        assert "state" not in calls[1][1] and calls[1][1]["root_path"] == ""

        named = Client(body([USER]))
        await fwd(http_scope("/v1/chat/completions", [(b"x-session-id", b"s1")]), named.receive, named.send)
        assert (named.status, calls[-1][0]) == (200, "session:s1")
        assert [m.content for m in (await rt.get_session("s1")).messages] == ["hi", "echo: hi"]


async def test_forwarder_gives_up_with_503_and_refuses_big_bodies_itself() -> None:
    calls: list[str] = []

    async def dead(key: str, scope: dict[str, Any], data: bytes) -> AsyncIterator[list[dict[str, Any]]]:
        calls.append(key)
        raise ReplicaDied
        yield []  # pragma: no cover

    fwd = Forwarder(dead, max_body_bytes=100, retryable=(ReplicaDied,), tries=3)
    client = Client(body([USER]))
    await fwd(http_scope("/v1/chat/completions", []), client.receive, client.send)
    assert (client.status, len(calls)) == (503, 3)
    big = Client(b"x" * 101)
    await fwd(http_scope("/v1/chat/completions", []), big.receive, big.send)
    assert (big.status, len(calls)) == (413, 3)
    health = Client(b"")
    await fwd(http_scope("/health", [], method="GET"), health.receive, health.send)
    assert calls[-1] == "path:/health"


def test_forwarded_scope_is_plain() -> None:
    scope = forwarded_scope(http_scope("/v1/models", [(bytearray(b"a"), bytearray(b"b"))], method="GET"))
    assert scope["headers"] == [(b"a", b"b")]
    assert scope["client"] == ("127.0.0.1", 5000)
    assert set(scope) == {
        "type",
        "asgi",
        "http_version",
        "method",
        "scheme",
        "path",
        "raw_path",
        "query_string",
        "headers",
        "root_path",
        "client",
        "server",
    }


async def test_a_caller_cancelled_while_the_replica_app_drains_is_cancelled() -> None:
    """`drive` gives the app time to wind down after its caller left; cancelling the caller then must cancel
    the caller (not be swallowed) and the app with it."""
    got_disconnect = anyio.Event()
    app_cancelled = anyio.Event()
    after_close: list[str] = []

    async def slow_to_leave(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"
        got_disconnect.set()
        try:
            await anyio.Event().wait()  # never winds down by itself
        except anyio.get_cancelled_exc_class():
            app_cancelled.set()
            raise

    batches: list[list[dict[str, Any]]] = []

    async def caller(scope: anyio.CancelScope) -> None:
        with scope:
            messages = drive(slow_to_leave, http_scope("/v1/chat/completions", []), b"{}", "r1")
            batches.append(await anext(messages))
            await messages.aclose()  # the caller leaves: drive tells the app and waits for it
            after_close.append("the close returned")  # pragma: no cover - only if the cancel was swallowed

    scope = anyio.CancelScope()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller, scope)
            await got_disconnect.wait()  # drive is now in its drain wait
            scope.cancel()
        await app_cancelled.wait()
    assert scope.cancelled_caught
    assert after_close == []
    assert [[m["type"] for m in b] for b in batches] == [["http.response.start", "http.response.body"]]
    assert batches[0][0]["headers"] == [(REPLICA_HEADER, b"r1")]
