"""Long prompts and clients that leave, on real llama.cpp (a tiny llama, n_batch 512) through the HTTP app's
raw ASGI interface: a gate inside the engine's decode holds the prefill after its first chunk (where a
client would be 1 s into a ~6,000-token prompt), so the test decides what happens meanwhile, no sleeps.

- A client that disconnects during the prefill stops it at the next chunk: exactly one decode runs after
  the disconnect and it is aborted (llama.cpp's abort callback); nothing is committed, the slot is free.
- A streamed request gets its first bytes before the prefill ends: Anthropic's `message_start` with the
  prompt's real token count (and a ping), an SSE comment for chat completions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from runtime import Runtime
from runtime.errors import LlamaDecodeError
from runtime.llama.engine import Engine
from runtime.log import capture_logs
from runtime.serve.http import app as make_app
from tests.support.raw_asgi import RawClient
from tests.support.tiny_models import write_llama

N_BATCH = 512
LONG = " ".join(f"w{i % 97}" for i in range(2100))  # ~6,100 tokens in the tiny byte-level vocabulary


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("long") / "long.gguf", n_ctx=8192)


class Gate:
    """Holds the engine's second prefill chunk until `go`; records every decode after it."""

    def __init__(self) -> None:
        self.calls = 0
        self.held = threading.Event()
        self.go = threading.Event()
        self.after: list[str] = []  # what each decode after the gate did: "ok" or "aborted"

    def wrap(self, decode: Any) -> Any:
        def gated(engine: Engine, tokens: Any, pos: int, **kw: Any) -> None:
            self.calls += 1
            if self.calls == 2 and len(tokens) == N_BATCH:
                self.held.set()
                self.go.wait(60)
            try:
                decode(engine, tokens, pos, **kw)
            except LlamaDecodeError as e:
                if self.go.is_set():
                    self.after.append("aborted" if e.code == 2 else f"error {e.code}")
                raise
            if self.go.is_set():
                self.after.append("ok")

        return gated


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate()
    monkeypatch.setattr(Engine, "decode", g.wrap(Engine.decode))
    yield g
    g.go.set()


@asynccontextmanager
async def runtime(model: Path) -> AsyncIterator[Runtime]:
    async with Runtime.open(model, n_ctx=8192, n_threads=1, n_batch=N_BATCH, n_ubatch=N_BATCH) as rt:
        yield rt


async def test_a_client_leaving_during_prefill_stops_it_at_the_next_chunk(long_model: Path, gate: Gate) -> None:
    async with runtime(long_model) as rt:
        application = make_app(rt)
        c = RawClient("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 4})
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.run, application)
                with anyio.fail_after(120):
                    await anyio.to_thread.run_sync(gate.held.wait)  # one chunk in: "1 s into the prefill"
                job = rt.scheduler.running
                assert job is not None and not job.cancelled
                c.leave()
                with anyio.fail_after(30):  # the disconnect reached the scheduler: the running job is cancelled
                    while not job.cancelled:
                        await anyio.lowlevel.checkpoint()
                gate.go.set()
        assert [e["where"] for e in logs if e["event"] == "request.cancelled"] == ["running"]
        assert gate.after == ["aborted"]  # the next chunk noticed, and nothing after it ran
        st = rt.stats()
        assert st.scheduler.cancelled == 1 and st.scheduler.completed == 0
        assert st.slot.prefilled_tokens <= N_BATCH  # the first chunk only: the aborted one left nothing
        assert application.state.turnstile.disconnects == 1 and c.sent == []
        # the slot is free: a short request runs at once
        reply = await rt.complete([{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.usage.generated_tokens == 2


@pytest.mark.parametrize("dialect", ["messages", "chat"])
async def test_a_streamed_long_prompt_gets_bytes_before_its_prefill_ends(
    long_model: Path, gate: Gate, dialect: str
) -> None:
    messages = [{"role": "user", "content": LONG}]
    body: dict[str, Any] = {"messages": messages, "max_tokens": 2, "stream": True, "temperature": 0}
    path = "/v1/messages" if dialect == "messages" else "/v1/chat/completions"
    async with runtime(long_model) as rt:
        application = make_app(rt)
        c = RawClient(path, body)
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run, application)
            with anyio.fail_after(120):
                await anyio.to_thread.run_sync(gate.held.wait)
                await c.first_body.wait()  # while the prefill is held
            early = c.text()
            assert c.sent[0]["status"] == 200
            gate.go.set()
        full = c.text()
    assert full.startswith(early) and len(full) > len(early)
    if dialect == "chat":  # the role-only first chunk, sent when the slot started the turn
        assert early.startswith("data: ") and early.endswith("\n\n") and early.count("\n\n") == 1
        first = json.loads(early.removeprefix("data: "))
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
        return
    events = [e for e in early.split("\n\n") if e]
    assert [e.split("\n")[0] for e in events] == ["event: message_start", "event: ping"]
    start = json.loads(events[0].split("\n")[1].removeprefix("data: "))
    last = [json.loads(e.split("\n")[1].removeprefix("data: ")) for e in full.split("\n\n") if "message_delta" in e]
    n_prompt = start["message"]["usage"]["input_tokens"] + start["message"]["usage"]["cache_read_input_tokens"]
    assert 6000 < n_prompt < 6500 and start["message"]["usage"]["cache_read_input_tokens"] == 0
    final = last[0]["usage"]
    assert final["input_tokens"] + final["cache_read_input_tokens"] == n_prompt
