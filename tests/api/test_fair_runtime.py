"""The fair policy in a Runtime on real llama.cpp (tiny llama): a long prompt pauses for short turns that come
during its prefill, and every reply equals the same turns run by `fifo` (text, cached and prefilled tokens)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from runtime import Reply, Runtime
from runtime.log import capture_logs
from runtime.loop.policy import Candidate, Chunk, Fair, Running

OPTS: dict[str, Any] = {"n_ctx": 2048, "n_threads": 1, "cache_ram_mib": 256, "n_batch": 64, "n_ubatch": 32}
GEN: dict[str, Any] = {"max_tokens": 6, "temperature": 0.0}
DOC = " ".join(f"line {i}: the cat and the dog tell me a story about the sea and the ship." for i in range(30))
SHORTS = 3


class GatedFair(Fair):
    """`Fair` whose first preemption check waits until the test has queued the short turns."""

    def __init__(self, defer_replies: bool = False) -> None:
        super().__init__(quantum_ms=0, defer_replies=defer_replies)
        self.reached = threading.Event()
        self.go = threading.Event()

    def preempt(self, running: Running, waiting: Sequence[Candidate]) -> bool:
        if not self.reached.is_set():
            self.reached.set()
            self.go.wait(30)
        return super().preempt(running, waiting)


@dataclass
class Played:
    """What one run of the long prompt and its short turns left: the long reply (None if cancelled), the short
    ones, the Runtime's stats after them and the long session's messages."""

    long: Reply | None
    shorts: list[Reply]
    stats: Any
    messages: tuple[Any, ...]


async def play(
    model: Path, policy: str, gate: Callable[[], GatedFair | GatedAbort] = GatedFair, cancel: bool = False
) -> Played:
    """The long prompt, and short turns queued during its prefill (under `fair` once `gate`'s first check is
    reached; under `fifo` once it runs); `cancel`: the long request is cancelled once it has paused."""
    async with Runtime.open(model, policy=policy, **OPTS) as rt:
        gated = gate()
        if policy == "fair":
            rt.scheduler.policy = gated  # before any job: the pause check is made per job from it
        await rt.create_session("long", system="You read documents.")
        for i in range(SHORTS):
            await rt.create_session(f"s{i}", system=f"You are agent {i}.")
        out: dict[str, Reply] = {}
        shorts: list[Reply | None] = [None] * SHORTS
        scope = anyio.CancelScope()

        async def long() -> None:
            with scope:
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
            if cancel:
                while rt.stats().scheduler.pauses < 1:  # paused: back in the queue behind the short turns
                    await anyio.lowlevel.checkpoint()
                scope.cancel()
        stats = rt.stats()
        messages = (await rt.get_session("long")).messages
    return Played(out.get("long"), [r for r in shorts if r is not None], stats, messages)


async def test_fair_pauses_the_long_prefill_for_short_turns_and_changes_no_reply(tiny_llama: Path) -> None:
    fifo, fair = await play(tiny_llama, "fifo"), None
    with capture_logs() as logs:
        fair = await play(tiny_llama, "fair")
    fifo_long, fifo_shorts, fifo_pauses = fifo.long, fifo.shorts, fifo.stats.scheduler.pauses
    fair_long, fair_shorts, fair_pauses = fair.long, fair.shorts, fair.stats.scheduler.pauses
    assert fifo_long is not None and fair_long is not None
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


async def test_deferred_replies_give_first_tokens_during_the_long_prompt_and_change_no_reply(tiny_llama: Path) -> None:
    fifo = await play(tiny_llama, "fifo")
    with capture_logs() as logs:
        fair = await play(tiny_llama, "fair", gate=lambda: GatedFair(defer_replies=True))
    assert fifo.long is not None and fair.long is not None and len(fair.shorts) == SHORTS
    ids = [r.request_id for r in fair.shorts]
    order = [(e["event"], e["request_id"]) for e in logs if e["event"] in ("request.paused", "request.done")]
    # each short turn paused after its first token (while the long prompt was paused), and ended after it
    decode_paused = [e["request_id"] for e in logs if e["event"] == "request.paused" and e["generated"] == 1]
    assert sorted(decode_paused) == sorted(ids)
    long_done = order.index(("request.done", fair.long.request_id))
    assert all(order.index(("request.paused", i)) < long_done < order.index(("request.done", i)) for i in ids)
    assert fair.stats.scheduler.decode_pauses == SHORTS
    # no reply changed: texts, cached and prefilled tokens are fifo's
    assert fair.long.text == fifo.long.text
    assert fair.long.usage.prefilled_tokens == fifo.long.usage.prefilled_tokens
    assert [r.text for r in fair.shorts] == [r.text for r in fifo.shorts]
    assert [r.usage.generated_tokens for r in fair.shorts] == [GEN["max_tokens"]] * SHORTS


async def test_a_request_cancelled_while_paused_commits_nothing(tiny_llama: Path) -> None:
    run = await play(tiny_llama, "fair", cancel=True)
    st = run.stats
    # completed: the sessions' creation and the short turns
    assert (st.scheduler.pauses, st.scheduler.cancelled, st.scheduler.completed) == (1, 1, 1 + 2 * SHORTS)
    assert run.long is None and len(run.shorts) == SHORTS and run.messages == ()
    assert st.slot.requests == SHORTS + 1  # the paused run counted once, never resumed


LONG_REPLY: dict[str, Any] = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}


class GatedDecode(Fair):
    """`Fair` whose first decode preemption check (after the long reply's first token) waits for the short turns."""

    def __init__(self) -> None:
        super().__init__(quantum_ms=0, decode_quantum_ms=0)
        self.reached = threading.Event()
        self.go = threading.Event()

    def preempt(self, running: Running, waiting: Sequence[Candidate]) -> bool:
        if running.decoding and not self.reached.is_set():
            self.reached.set()
            self.go.wait(30)
        return super().preempt(running, waiting)


async def play_decode(
    model: Path, policy: str, cancel: bool = False
) -> tuple[list[str], Reply | None, list[Reply], Any]:
    """One long reply (streamed) and short turns queued after its first token: (its pieces, it, the short ones)."""
    async with Runtime.open(model, policy=policy, **OPTS) as rt:
        gated = GatedDecode()
        if policy == "fair":
            rt.scheduler.policy = gated
        await rt.create_session("g", system="You tell stories.")
        for i in range(SHORTS):
            await rt.create_session(f"s{i}", system=f"You are agent {i}.")
        pieces: list[str] = []
        out: dict[str, Reply] = {}
        shorts: list[Reply | None] = [None] * SHORTS
        scope = anyio.CancelScope()

        async def long() -> None:
            with scope:
                async for item in rt.stream("g", "Tell me a long story about the sea.", **LONG_REPLY):
                    if isinstance(item, Reply):
                        out["g"] = item
                    else:
                        pieces.append(item)

        async def short(i: int) -> None:
            shorts[i] = await rt.chat(f"s{i}", f"hello {i}, tell me about the moon", **GEN)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long)
            if policy == "fair":
                await anyio.to_thread.run_sync(gated.reached.wait, 30)  # its first token is out
            else:
                while rt.scheduler.running is None:
                    await anyio.lowlevel.checkpoint()
            for i in range(SHORTS):
                tg.start_soon(short, i)
            while len(rt.scheduler) < SHORTS:
                await anyio.lowlevel.checkpoint()
            gated.go.set()
            if cancel:
                while rt.stats().scheduler.decode_pauses < 1:
                    await anyio.lowlevel.checkpoint()
                scope.cancel()
        stats = (rt.stats(), (await rt.get_session("g")).messages)
    return pieces, out.get("g"), [r for r in shorts if r is not None], stats


async def test_fair_pauses_a_generation_for_first_tokens_and_changes_no_reply(tiny_llama: Path) -> None:
    fifo_pieces, fifo_long, fifo_shorts, _ = await play_decode(tiny_llama, "fifo")
    with capture_logs() as logs:
        pieces, fair_long, fair_shorts, (st, _) = await play_decode(tiny_llama, "fair")
    assert fifo_long is not None and fair_long is not None
    assert st.scheduler.decode_pauses >= 1 and st.scheduler.pauses == st.scheduler.decode_pauses
    # every short turn had its first token before the long reply's end
    events = [(e["event"], e.get("request_id")) for e in logs]
    end = events.index(("request.done", fair_long.request_id))
    firsts = [rid for ev, rid in events[:end] if ev == "request.first_token" and rid != fair_long.request_id]
    assert sorted(firsts) == sorted(r.request_id for r in fair_shorts)
    # no reply changed: texts, tokens counted, and the stream saw each piece once, in order
    assert fair_long.text == fifo_long.text == "".join(pieces) and pieces == fifo_pieces
    assert fair_long.usage == fifo_long.usage and fair_long.usage.generated_tokens == 24
    assert [r.text for r in fair_shorts] == [r.text for r in fifo_shorts]
    assert fair_long.timings.paused > 0 and fifo_long.timings.paused == 0
    paused = [e for e in logs if e["event"] == "request.paused" and e["request_id"] == fair_long.request_id]
    # the check after its first token saw the queue as it was before the short turns came; the next one paused
    assert paused[0]["generated"] == 2
    resumed = [e for e in logs if e["event"] == "cache.decision" and e.get("request_id") == fair_long.request_id]
    assert resumed[-1]["source"] == "ram" and resumed[-1]["cached"] == paused[-1]["done"]  # its whole state


async def test_a_generation_cancelled_while_paused_commits_nothing(tiny_llama: Path) -> None:
    _, long, shorts, (st, messages) = await play_decode(tiny_llama, "fair", cancel=True)
    assert long is None and messages == () and len(shorts) == SHORTS
    assert st.scheduler.decode_pauses >= 1 and st.scheduler.cancelled == 1  # (the short turns pause each other too)
    assert st.slot.requests == SHORTS + 1 and st.slot.generated_tokens == SHORTS * GEN["max_tokens"]


class GatedAbort(Fair):
    """`Fair` that pauses a prefill only by aborting a chunk (never at a boundary): its first boundary check waits
    until the test has queued the short turns; the next chunk is then aborted at its first graph node."""

    def __init__(self) -> None:
        super().__init__(quantum_ms=0, abort_ms=0)
        self.reached = threading.Event()
        self.go = threading.Event()

    def preempt(self, running: Running, waiting: Sequence[Candidate]) -> bool:
        if not running.decoding and not self.reached.is_set():
            self.reached.set()
            self.go.wait(30)
        return False if not running.decoding else super().preempt(running, waiting)

    def abort_at(self, running: Running, waiting: Sequence[Candidate], chunk: Chunk, now: float) -> float:
        return super().abort_at(running, waiting, chunk, now) if running.session_id == "long" else math.inf


async def test_fair_aborts_a_running_chunk_for_short_turns_and_changes_no_reply(tiny_llama: Path) -> None:
    fifo = await play(tiny_llama, "fifo", GatedAbort)
    with capture_logs() as logs:
        fair = await play(tiny_llama, "fair", GatedAbort)
    fifo_long, fifo_shorts, fair_long, fair_shorts, st = fifo.long, fifo.shorts, fair.long, fair.shorts, fair.stats
    assert fifo_long is not None and fair_long is not None
    batch, ubatch = OPTS["n_batch"], OPTS["n_ubatch"]
    # the second chunk was aborted at its first node (its first ubatch: nothing kept), and evaluated again later
    assert (st.scheduler.pauses, st.scheduler.prefill_aborts, st.scheduler.aborted_tokens) == (1, 1, batch)
    assert st.scheduler.aborted_seconds > 0 and batch % ubatch == 0
    paused = [e for e in logs if e["event"] == "request.paused"]
    assert [(e["done"], e["aborted_tokens"]) for e in paused] == [(batch, batch)]
    done = [e["request_id"] for e in logs if e["event"] == "request.done"]
    assert done.index(fair_long.request_id) == len(done) - 1  # the short turns ran while it was paused
    # no reply changed, and the long one counts what the slot kept, as if it had never paused
    assert fair_long.text == fifo_long.text and [r.text for r in fair_shorts] == [r.text for r in fifo_shorts]
    assert fair_long.usage.cached_tokens == fifo_long.usage.cached_tokens
    assert fair_long.usage.prefilled_tokens == fifo_long.usage.prefilled_tokens == fifo_long.usage.prompt_tokens
    assert fair_long.usage.aborted_tokens == batch and fifo_long.usage.aborted_tokens == 0
    assert 0 < fair_long.timings.aborted <= fair_long.timings.prefill and fifo_long.timings.aborted == 0
    assert fair_long.timings.paused > 0


async def test_a_request_cancelled_after_an_aborted_chunk_commits_nothing(tiny_llama: Path) -> None:
    run = await play(tiny_llama, "fair", GatedAbort, cancel=True)
    long, shorts, st, messages = run.long, run.shorts, run.stats, run.messages
    assert long is None and messages == () and len(shorts) == SHORTS
    assert (st.scheduler.pauses, st.scheduler.prefill_aborts, st.scheduler.cancelled) == (1, 1, 1)
    assert st.slot.requests == SHORTS + 1  # the paused run counted once, never resumed
    assert st.slot.prefilled_tokens == OPTS["n_batch"] + sum(r.usage.prefilled_tokens for r in shorts)
