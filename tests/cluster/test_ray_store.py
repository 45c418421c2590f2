"""`Runtime.open(session_store=...)`, what every replica of a cluster opens: a store object or a Redis URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.api import Runtime
from runtime.errors import InvalidConfig, StoreConfigError
from sessions import MemoryStore
from sessions.redis import RedisStore
from tests.support.redis_server import running_redis


async def test_a_store_object_is_used_and_closed_with_the_runtime(tiny_llama: Path, tmp_path: Path) -> None:
    store = MemoryStore()
    async with Runtime.open(tiny_llama, n_ctx=1024, n_threads=1, data_dir=tmp_path, session_store=store) as rt:
        assert rt.store is store
        await rt.chat("s", "hi", max_tokens=2, temperature=0)
        assert store.list() == ["s"]
    assert not (tmp_path / "sessions").exists()  # data_dir holds only the disk tier
    assert (tmp_path / "states").is_dir()


async def test_a_redis_url_opens_a_redis_store(tiny_llama: Path, tmp_path: Path) -> None:
    with running_redis(tmp_path / "redis") as server:
        async with Runtime.open(tiny_llama, n_ctx=1024, n_threads=1, session_store=server.url) as rt:
            assert isinstance(rt.store, RedisStore)
            reply = await rt.chat("s", "hi", max_tokens=2, temperature=0)
        other = RedisStore.from_url(server.url)
        try:
            assert [m.content for m in other.get("s").messages] == ["hi", reply.text]
        finally:
            other.close()


@pytest.mark.parametrize("bad", [123, b"redis://x", object()])
async def test_a_bad_store_is_refused_before_the_model_loads(tiny_llama: Path, bad: object) -> None:
    with pytest.raises(InvalidConfig, match="session_store"):
        async with Runtime.open(tiny_llama, session_store=bad):  # type: ignore[arg-type]
            pass


async def test_a_url_redis_cannot_use_is_a_store_config_error(tiny_llama: Path) -> None:
    with pytest.raises(StoreConfigError):
        async with Runtime.open(tiny_llama, n_ctx=1024, n_threads=1, session_store="http://not-redis"):
            pass
