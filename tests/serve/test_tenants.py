"""API keys as tenants (runtime.serve.http.tenants): the key file's format and its damaged lines, the
constant-time lookup, id namespaces, and the app's auth (x-api-key, Bearer, 401 in each API's shape,
sessions of one key invisible to another, metrics by key name), in-process on the scripted backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.errors import InvalidConfig, InvalidKeyFile, InvalidSessionId, TurnstileError
from runtime.serve.http import app as make_app
from runtime.serve.http.tenants import DEFAULT_TENANT, Keyring, Tenant, parse_key_file, tenant_of
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

HI = [{"role": "user", "content": "hi there"}]


def key_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return path


def test_key_file_format(tmp_path: Path) -> None:
    path = key_file(tmp_path, "# team keys\n\nalice: sk-aaa\n  bob:sk-bbb  \nsk-ccc\t# the CI\nsk-#d  # ok\n")
    assert parse_key_file(path) == [
        (3, "alice", "sk-aaa"),
        (4, "bob", "sk-bbb"),
        (5, "key5", "sk-ccc"),
        (6, "key6", "sk-#d"),
    ]
    ring = Keyring.from_options(None, path)
    assert [t.name for t in ring.tenants] == ["alice", "bob", "key5", "key6"]
    assert ring.tenant("sk-bbb") == Tenant("bob", "bob@")
    assert ring.tenant(b"sk-aaa") == Tenant("alice", "alice@")
    assert ring.tenant("sk-aa") is None and ring.tenant("") is None and ring.tenant(None) is None


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("alice: sk-a\nbad name: sk-b\n", 2, "name before ':'"),
        ("alice: sk-a\n\nbob: two words\n", 3, "printable ASCII"),
        ("alice: \n", 1, "printable ASCII"),
        ("alice: sk-a\nalice: sk-b\n", 2, "'alice' is already used on line 1"),
        ("alice: sk-a\n# c\nbob: sk-a\n", 3, "same key is already on line 1"),
        ("sk-\x01\n", 1, "printable ASCII"),
    ],
)
def test_a_damaged_line_names_its_number(tmp_path: Path, text: str, line: int, reason: str) -> None:
    path = key_file(tmp_path, text)
    with pytest.raises(InvalidKeyFile) as e:
        parse_key_file(path)
    assert e.value.line == line
    assert f"{path}:{line}:" in str(e.value) and reason in str(e.value)


def test_an_empty_or_missing_file_and_clashes_with_api_key(tmp_path: Path) -> None:
    with pytest.raises(InvalidKeyFile, match="holds no key"):
        parse_key_file(key_file(tmp_path, "# nothing\n\n"))
    with pytest.raises(InvalidKeyFile, match="cannot read it"):
        parse_key_file(tmp_path / "absent")
    with pytest.raises(InvalidKeyFile, match=r"keys.txt:2: this key is also given as --api-key"):
        Keyring.from_options("sk-x", key_file(tmp_path, "a: sk-a\nb: sk-x\n"))
    with pytest.raises(InvalidKeyFile, match=r"keys.txt:1: the name 'default' is --api-key's"):
        Keyring.from_options("sk-x", key_file(tmp_path, "default: sk-a\n"))
    ring = Keyring.from_options("sk-x", key_file(tmp_path, "a: sk-a\n"))
    assert ring.tenant("sk-x") == Tenant("default", "default@") and ring.tenant("sk-a") == Tenant("a", "a@")


def test_namespaces() -> None:
    sole = Keyring.from_options("sk-one")
    assert sole.tenant("sk-one") == DEFAULT_TENANT and DEFAULT_TENANT.session_id("chat-1") == "chat-1"
    assert Keyring().tenant(None) == DEFAULT_TENANT and not Keyring().required
    a, ab = Tenant("a", "a@"), Tenant("ab", "ab@")
    assert a.session_id("x@y") == "a@x@y" and ab.session_id("x") == "ab@x"
    assert a.owns("a@x@y") and not a.owns("ab@x") and not ab.owns("a@b") and not a.owns("a@")
    assert a.client_id("a@x@y") == "x@y"
    assert a.session_id("s" * 126) == "a@" + "s" * 126
    for bad in ("s" * 127, "", "has space", "é"):
        with pytest.raises(InvalidSessionId):
            a.session_id(bad)
    with pytest.raises(InvalidSessionId):
        a.client_id("ab@x")
    with pytest.raises(InvalidConfig):
        Tenant("a@b")
    with pytest.raises(InvalidConfig):
        Tenant("a", "b@")
    with pytest.raises(TurnstileError, match="auth middleware did not run"):
        tenant_of({"type": "http"})


async def _post(application: Any, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
        return await c.post(path, content=json.dumps(body).encode(), headers=headers)


async def test_app_auth_and_session_isolation(tmp_path: Path) -> None:
    ring = Keyring.from_options(None, key_file(tmp_path, "alice: sk-a\nbob: sk-b\n"))
    store = MemoryStore()
    async with Runtime.serve(ScriptedBackend(n_ctx=400), store) as rt:
        application = make_app(rt, keyring=ring)
        body = {"messages": HI, "max_tokens": 5}
        r = await _post(application, "/v1/chat/completions", body, {})
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        r = await _post(application, "/v1/messages", body, {"x-api-key": "nope"})
        assert r.status_code == 401
        assert r.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "incorrect API key provided"},
        }
        ok = await _post(application, "/v1/chat/completions", body, {"x-api-key": "sk-a", "X-Session-Id": "s1"})
        assert ok.status_code == 200
        ok = await _post(
            application, "/v1/chat/completions", body, {"Authorization": "Bearer sk-b", "X-Session-Id": "s1"}
        )
        assert ok.status_code == 200
        assert sorted(store.list()) == ["alice@s1", "bob@s1"]  # one client id, two sessions
        assert len(store.get("alice@s1").messages) == 2 and len(store.get("bob@s1").messages) == 2
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://t") as c:
            text = (await c.get("/metrics", headers={"x-api-key": "sk-a"})).text
        assert 'turnstile_http_responses_by_key_total{key="alice",status="200"} 1' in text
        assert 'turnstile_http_responses_by_key_total{key="bob",status="200"} 1' in text
        assert "sk-a" not in text and "sk-b" not in text


async def test_api_key_and_keyring_are_exclusive() -> None:
    with pytest.raises(InvalidConfig, match="not both"):
        make_app(None, api_key="k", keyring=Keyring())
