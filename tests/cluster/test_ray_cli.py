"""`turnstile serve --replicas N` as a real process: it starts a local Ray instance, deploys, prints its ready
line, answers with the replica header, keeps named sessions in Redis, and exits 0 on SIGTERM."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest

from sessions.redis import RedisStore
from tests.support.process import ServeProcess
from tests.support.redis_server import running_redis

pytestmark = pytest.mark.ray


def test_turnstile_serve_with_replicas(tiny_llama: Path, tmp_path: Path) -> None:
    with running_redis(tmp_path / "redis") as redis:
        args = ["--model", tiny_llama, "--replicas", "1", "--threads", "1", "--ctx", "1024"]
        srv = ServeProcess(*args, "--session-store", redis.url, "--num-cpus-per-replica", "0")
        with srv:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
            r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers={"X-Session-Id": "s"}, timeout=60)
            assert r.status_code == 200, r.text
            assert r.headers["x-turnstile-replica"]
            reply = r.json()["choices"][0]["message"]["content"]
            store = RedisStore.from_url(redis.url)
            try:
                assert [(m.role, m.content) for m in store.get("s").messages] == [("user", "hi"), ("assistant", reply)]
            finally:
                store.close()
        assert srv.returncode == 0, srv.stderr()[-3000:]
