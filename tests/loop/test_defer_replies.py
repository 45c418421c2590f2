"""`Fair(defer_replies=True)`: short turns get their first tokens during a long prompt and the rest after it.

Decisions without a model, then the scheduler with real anyio tasks: a job's `execute` plays a prefill in chunks
(asking the pause check between two, as the slot does) and then a generation (asking the decode check after each
token), raising `PrefillPaused` / `DecodePaused` when told to and going on from there next time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import pytest

from runtime.backend.protocol import DecodePaused, PrefillPaused
from runtime.config import RuntimeConfig
from runtime.errors import InvalidConfig
from runtime.loop.policy import Chunk, Cost, Fair, Running, make_policy
from runtime.loop.scheduler import Job, Scheduler
from tests.support.policy_cases import C, running


@dataclass
class W(C):
    """A waiting request that may be a paused prompt or a paused generation."""

    decoding: bool = False
    prompt_paused: bool = False


def test_replies_wait_while_a_paused_prompt_waits_first_tokens_do_not() -> None:
    long = W("long", 1, cost=Cost(5000, 16), prompt_paused=True)
    reply = W("g", 2, cost=Cost(0, 40), decoding=True)
    fresh = W("s", 5, cost=Cost(100, 48))
    defer = Fair(defer_replies=True)
    assert defer.pick([long, reply, fresh], lambda c: 0) is fresh  # a first token still comes first
    assert defer.pick([long, reply], lambda c: 0) is long  # the reply waits for the paused prompt
    assert Fair().pick([long, reply], lambda c: 0) is reply  # (without deferring: the reply first)
    reply.skips = 4
    assert defer.pick([long, reply], lambda c: 0) is long  # passed over or not, it waits for the prompt
    long.prompt_paused = False  # a long prompt that has not started yet: replies go first as usual
    assert defer.pick([long, reply], lambda c: 0) is reply


def test_a_reply_yields_to_a_paused_prompt_right_after_its_token_and_never_preempts_a_prompt() -> None:
    defer = Fair(quantum_ms=0, decode_quantum_ms=100, defer_replies=True)
    gen = Running("g", 0.0, Cost(0, 40), 0, decoding=True)
    paused = [W("long", 1, cost=Cost(4000, 16), prompt_paused=True)]
    assert defer.preempt(gen, paused)  # inside its decode quantum, it yields at once
    assert not Fair(quantum_ms=0, decode_quantum_ms=100).preempt(gen, paused)
    assert not defer.preempt(gen, [W("long", 1, cost=Cost(4000, 16))])  # a prompt that never ran: as before
    assert not defer.preempt(Running("long", 0.0, Cost(0, 40), 0, decoding=True), paused)  # its own session
    # a running prefill yields to first tokens only, never to a reply that has its first token
    assert not defer.preempt(running(1.0, 4000), [W("g", 2, cost=Cost(0, 40), decoding=True)])
    assert Fair(quantum_ms=0).preempt(running(1.0, 4000), [W("g", 2, cost=Cost(0, 40), decoding=True)])
    assert defer.preempt(running(1.0, 4000), [W("s", 2, cost=Cost(100, 48))])
    # nor is a running chunk aborted for a reply
    chunk = Chunk(started=0.0, ends=10.0)
    assert defer.abort_at(running(1.0, 4000), [W("g", 2, cost=Cost(0, 40), decoding=True)], chunk, 1.0) == float("inf")
    assert defer.abort_at(running(1.0, 4000), [W("s", 2, cost=Cost(100, 48))], chunk, 1.0) == 1.0


def test_defer_replies_by_name_config_and_cli() -> None:
    fair = make_policy("fair", defer_replies=True)
    assert isinstance(fair, Fair) and fair.defer_replies and fair.pauses_decode
    assert isinstance(make_policy("fair", None, float("inf"), None, True), Fair)
    assert make_policy("fair", None, float("inf"), None, True).pauses_decode  # type: ignore[attr-defined]
    assert not Fair().defer_replies
    assert (Fair().max_aborts, fair.max_aborts, Fair(max_aborts=2, defer_replies=True).max_aborts) == (4, 8, 2)
    assert RuntimeConfig.build(policy="fair", defer_replies=True).scheduler.defer_replies is True
    for bad in (1, "yes", None):
        with pytest.raises(InvalidConfig, match="defer_replies"):
            RuntimeConfig.build(policy="fair", defer_replies=bad)
    from runtime.cli import build_parser

    assert build_parser().parse_args(["serve", "--policy", "fair", "--defer-replies"]).defer_replies is True
    assert build_parser().parse_args(["serve"]).defer_replies is False


class Carried:
    def close(self) -> None:
        pass


class Turns:
    """Jobs that prefill `prompt` tokens in chunks of 100, then generate `gen` tokens one at a time."""

    def __init__(self) -> None:
        self.done: dict[int, tuple[int, int]] = {}  # job id: (prompt tokens done, tokens generated)
        self.runs: list[tuple[str, int, int, int, int]] = []  # (session, prefill from, to, generated from, to)
        self.gate: anyio.Event | None = None
        self.started = anyio.Event()

    def work(self, prompt: int, gen: int) -> Callable[[Job[int]], Awaitable[int]]:
        async def execute(job: Job[int]) -> int:
            p0, g0 = self.done.get(job.id, (0, 0))
            p, g = p0, g0
            self.started.set()
            try:
                while p < prompt:
                    if p > p0 and job.pause_check is not None and job.pause_check(p, prompt):
                        self.done[job.id] = (p, 0)
                        raise PrefillPaused(p, prompt, 0, p - p0, 0.0, "none")
                    if self.gate is not None:
                        await self.gate.wait()
                    await anyio.lowlevel.checkpoint()
                    p = min(prompt, p + 100)
                while g < gen:
                    await anyio.lowlevel.checkpoint()
                    g += 1
                    if g < gen and job.decode_check is not None and job.decode_check(g):
                        self.done[job.id] = (p, g)
                        raise DecodePaused(p, prompt, 0, 0, 0.0, "none", generated=g, t_decode=0.0, carry=Carried())
            finally:
                self.runs.append((job.session_id, p0, p, g0, g))
            return g

        return execute


async def play(policy: Fair) -> list[tuple[str, int, int, int, int]]:
    t = Turns()
    sched = Scheduler(policy=policy)
    t.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        long = sched.submit("long", t.work(1000, 2), cost=Cost(1000, 2))
        await t.started.wait()  # the long prompt holds the slot, in its first chunk
        shorts = [sched.submit(f"s{i}", t.work(100, 5), cost=Cost(100, 5)) for i in range(2)]
        gate, t.gate = t.gate, None
        gate.set()
        assert await sched.wait(long) == 2
        assert [await sched.wait(j) for j in shorts] == [5, 5]
        await sched.close()
    return t.runs


async def test_short_turns_get_first_tokens_during_the_long_prompt_and_the_rest_after_it() -> None:
    runs = await play(Fair(quantum_ms=0, decode_quantum_ms=0, defer_replies=True))
    assert runs == [
        ("long", 0, 100, 0, 0),  # the long prompt's first chunk; the short turns arrive
        ("s0", 0, 100, 0, 1),  # each short turn: its prompt and first token, then it yields
        ("s1", 0, 100, 0, 1),
        ("long", 100, 1000, 0, 2),  # the rest of the long prompt, not preempted by the replies, and its reply
        ("s0", 100, 100, 1, 5),  # then the short replies go on from their first token
        ("s1", 100, 100, 1, 5),
    ]
    # without deferring, each short reply runs to its end before the long prompt goes on
    assert await play(Fair(quantum_ms=0, decode_quantum_ms=0)) == [
        ("long", 0, 100, 0, 0),
        ("s0", 0, 100, 0, 5),
        ("s1", 0, 100, 0, 5),
        ("long", 100, 1000, 0, 2),
    ]
