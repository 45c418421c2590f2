"""The fair policy in a Runtime on real llama.cpp (tiny llama): a long prompt pauses for short turns that come
during its prefill, and every reply equals the same turns run by `fifo` (text, cached and prefilled tokens)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from runtime import Reply, Runtime
from runtime.log import capture_logs
from runtime.loop.policy import Candidate, Fair, Running

OPTS: dict[str, Any] = {"n_ctx": 2048, "n_threads": 1, "cache_ram_mib": 256, "n_batch": 64, "n_ubatch": 32}
GEN: dict[str, Any] = {"max_tokens": 6, "temperature": 0.0}
DOC = " ".join(f"line {i}: the cat and the dog tell me a story about the sea and the ship." for i in range(30))
SHORTS = 3


class GatedFair(Fair):
    """`Fair` whose first preemption check waits until the test has queued the short turns."""

    def __init__(self) -> None:
        super().__init__(quantum_ms=0)
        self.reached = threading.Event()
        self.go = threading.Event()

    def preempt(self, running: Running, waiting: Sequence[Candidate]) -> bool:
        if not self.reached.is_set():
            self.reached.set()
            self.go.wait(30)
        return super().preempt(running, waiting)


async def play(model: Path, policy: str) -> tuple[Reply, list[Reply], int]:
    async with Runtime.open(model, policy=policy, **OPTS) as rt:
        gated = GatedFair()
        if policy == "fair":
            rt.scheduler.policy = gated  # before any job: the pause check is made per job from it
        await rt.create_session("long", system="You read documents.")
        for i in range(SHORTS):
            await rt.create_session(f"s{i}", system=f"You are agent {i}.")
        shorts: list[Reply | None] = [None] * SHORTS
        out: dict[str, Reply] = {}

        async def long() -> None:
            out["long"] = await rt.chat("long", f"Summarize: {DOC}", **GEN)

        async def short(i: int) -> None:
            shorts[i] = await rt.chat(f"s{i}", f"hello {i}, tell me about the moon", **GEN)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long)
            if policy == "fair":
                await anyio.to_thread.run_sync(gated.reached.wait, 30)  # the long prefill did one chunk
            else:
                while rt.scheduler.running is None:
                    await anyio.lowlevel.checkpoint()
            for i in range(SHORTS):
                tg.start_soon(short, i)
            while len(rt.scheduler) < SHORTS:  # all queued behind the running long prompt
                await anyio.lowlevel.checkpoint()
            gated.go.set()
        pauses = rt.stats().scheduler.pauses
    return out["long"], [r for r in shorts if r is not None], pauses


async def test_fair_pauses_the_long_prefill_for_short_turns_and_changes_no_reply(tiny_llama: Path) -> None:
    fifo_long, fifo_shorts, fifo_pauses = await play(tiny_llama, "fifo")
    with capture_logs() as logs:
        fair_long, fair_shorts, fair_pauses = await play(tiny_llama, "fair")
    assert fifo_pauses == 0 and fair_pauses >= 1 and len(fair_shorts) == len(fifo_shorts) == SHORTS
    paused = [e for e in logs if e["event"] == "request.paused"]
    resumed = [e for e in logs if e["event"] == "request.resumed"]
    assert len(paused) == len(resumed) == fair_pauses
    assert all(e["request_id"] == fair_long.request_id for e in paused + resumed)
    assert paused[0]["done"] % OPTS["n_batch"] == 0 and paused[0]["total"] == fair_long.usage.prompt_tokens
    # the short turns ran while the long one was paused: each finished before it
    done = [e["request_id"] for e in logs if e["event"] == "request.done"]
    assert done.index(fair_long.request_id) == len(done) - 1
    # no reply changed, and the long one counts its tokens as if it had never paused
    assert fair_long.text == fifo_long.text
    assert [r.text for r in fair_shorts] == [r.text for r in fifo_shorts]
    assert fair_long.usage.cached_tokens == fifo_long.usage.cached_tokens
    assert fair_long.usage.prefilled_tokens == fifo_long.usage.prefilled_tokens == fifo_long.usage.prompt_tokens
    assert fair_long.timings.paused > 0 and fifo_long.timings.paused == 0
    ram_loads = [e for e in logs if e["event"] == "cache.decision" and e.get("request_id") == fair_long.request_id]
    assert ram_loads[-1]["source"] == "ram" and ram_loads[-1]["cached"] == paused[-1]["done"]


async def test_a_request_cancelled_while_paused_commits_nothing(tiny_llama: Path) -> None:
    async with Runtime.open(tiny_llama, policy="fair", **OPTS) as rt:
        gated = GatedFair()
        rt.scheduler.policy = gated
        await rt.create_session("long", system="You read documents.")
        for i in range(SHORTS):
            await rt.create_session(f"s{i}", system=f"You are agent {i}.")
        shorts: list[Reply] = []
        scope = anyio.CancelScope()

        async def long() -> None:
            with scope:
                await rt.chat("long", f"Summarize: {DOC}", **GEN)

        async def short(i: int) -> None:
            shorts.append(await rt.chat(f"s{i}", f"hello {i}, tell me about the moon", **GEN))

        async with anyio.create_task_group() as tg:
            tg.start_soon(long)
            await anyio.to_thread.run_sync(gated.reached.wait, 30)
            for i in range(SHORTS):
                tg.start_soon(short, i)
            while len(rt.scheduler) < SHORTS:
                await anyio.lowlevel.checkpoint()
            gated.go.set()
            while rt.stats().scheduler.pauses < 1:  # paused: back in the queue behind the short turns
                await anyio.lowlevel.checkpoint()
            scope.cancel()
        st = rt.stats()
        # completed: the sessions' creation and the short turns
        assert (st.scheduler.pauses, st.scheduler.cancelled, st.scheduler.completed) == (1, 1, 1 + 2 * SHORTS)
        assert len(shorts) == SHORTS and (await rt.get_session("long")).messages == ()
        assert st.slot.requests == SHORTS + 1  # the paused run counted once, never resumed
