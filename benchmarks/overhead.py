"""`python -m benchmarks overhead`: what the scheduler and the Runtime cost per request, with no model at all.

A scripted instant engine stands in for llama.cpp: `render` returns a fixed token list per conversation,
`Slot.run` returns a finished result at once. Everything else is real: `Runtime.serve(...)` with an
in-memory session store, the scheduler and its policy, the worker thread hop, the session commit.

For each queue depth N (1, 10, 100, 1,000) a round submits N requests at once (one per session, each
session created beforehand) and waits for all of them; the table shows the median over rounds of the
round's wall time / N, for two layers:
- `scheduler`: `Scheduler.submit` + its worker loop with a job that returns at once;
- `runtime`: `await rt.chat(...)` end to end (render, slot run in the worker thread, commit, Reply).

    python -m benchmarks overhead [--depths 1,10,100,1000] [--requests 2000] [--policies fifo,affinity]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any, cast

import anyio
import msgspec

from benchmarks import _workload as w
from runtime import Runtime
from runtime.engine import RenderedChat
from runtime.scheduler import Job, Scheduler
from runtime.slot import SlotRequest, SlotResult, SlotStats
from sessions import MemoryStore

COLUMNS = ["layer", "policy", "queued", "rounds", "requests", "us_per_request", "us_p90_round", "total_s"]


class InstantEngine:
    """What the Runtime asks of an engine (`render`, `needs_checkpoints`, `close`), answered at once."""

    n_ctx = 1 << 20
    needs_checkpoints = False

    def render(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True, spans: bool = True
    ) -> RenderedChat:
        base = 1000 * (sum(map(ord, messages[0]["content"])) % 10_000) if messages else 0
        tokens = list(range(base, base + 24 + 8 * len(messages)))
        starts = [min(i * 8, len(tokens) - 1) for i in range(len(messages))]
        return RenderedChat(text="", tokens=tokens, message_starts=starts, roles=[m["role"] for m in messages])

    def close(self) -> None:
        pass


class InstantSlot:
    """What the Runtime asks of a slot (`run`, `tokens`, `cache`, `flush`, `stats`): a result at once."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.cache: Any = None
        self.requests = 0

    def run(self, req: SlotRequest) -> SlotResult:
        self.requests += 1
        self.tokens = [*req.prompt, 1]
        if req.on_piece is not None:
            req.on_piece("ok")
        n = len(req.prompt)
        return SlotResult(
            text="ok",
            finish_reason="stop",
            tokens=[1, 2],
            prompt_tokens=n,
            cached_tokens=0,
            prefilled_tokens=n,
            cache_source="none",
            bytes_saved=0,
            bytes_restored=0,
            t_cache=0.0,
            t_prefill=0.0,
            t_decode=0.0,
            t_first_token=0.0,
        )

    def flush(self) -> int:
        return 0

    def stats(self) -> SlotStats:
        return SlotStats(
            requests=self.requests,
            prompt_tokens=0,
            cached_tokens=0,
            prefilled_tokens=0,
            generated_tokens=0,
            swaps=0,
            ram_loads=0,
            disk_loads=0,
            checkpoint_restores=0,
            checkpoints=0,
            slot_tokens=len(self.tokens),
            ram_entries=0,
            ram_bytes=0,
        )


def rounds_for(depth: int, requests: int) -> int:
    return max(3, requests // depth)


async def _scheduler_rounds(policy: str, depth: int, rounds: int) -> list[float]:
    sched = Scheduler(policy=policy, max_queued=max(1024, depth))

    async def execute(_job: Job) -> int:
        return 0

    times: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(sched.run)
        for r in range(rounds):
            t0 = time.perf_counter()
            jobs = [sched.submit(f"r{r}-s{i}", execute) for i in range(depth)]
            for job in jobs:
                await sched.wait(job)
            times.append(time.perf_counter() - t0)
        await sched.close()
    return times


async def _runtime_rounds(policy: str, depth: int, rounds: int) -> list[float]:
    engine, slot = InstantEngine(), InstantSlot()
    times: list[float] = []
    async with Runtime.serve(
        cast(Any, engine), MemoryStore(), cast(Any, slot), None, policy=policy, max_queued=max(1024, depth)
    ) as rt:
        for r in range(rounds):
            sids = [f"r{r}-s{i}" for i in range(depth)]
            for i, sid in enumerate(sids):  # not timed: every timed request is a turn of an existing session
                await rt.create_session(sid, system=f"You are agent {i}.")
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for sid in sids:
                    tg.start_soon(_chat, rt, sid)
            times.append(time.perf_counter() - t0)
        st = rt.stats()
    if st.scheduler.completed < rounds * depth or st.scheduler.failed:
        raise RuntimeError(f"the runtime did not complete every request: {msgspec.structs.asdict(st.scheduler)}")
    return times


async def _chat(rt: Runtime, sid: str) -> None:
    await rt.chat(sid, "hello")


def _row(layer: str, policy: str, depth: int, times: list[float]) -> dict[str, Any]:
    per = [t / depth for t in times]
    return {
        "layer": layer,
        "policy": policy,
        "queued": depth,
        "rounds": len(times),
        "requests": depth * len(times),
        "us_per_request": round(1e6 * statistics.median(per), 1),
        "us_p90_round": round(1e6 * w.percentile(per, 90), 1),
        "total_s": round(sum(times), 3),
    }


def main(argv: list[str]) -> None:
    ap = w.parser("overhead", __doc__)
    ap.add_argument("--depths", default="1,10,100,1000", help="queued requests per round, comma-separated")
    ap.add_argument("--requests", type=int, default=2000, help="requests per depth (at least 3 rounds)")
    ap.add_argument("--policies", default="fifo,affinity")
    ap.add_argument("--layers", default="scheduler,runtime")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write overhead.json")
    args = ap.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",") if d]
    policies = [p for p in args.policies.split(",") if p]
    layers = [x for x in args.layers.split(",") if x]
    if any(x not in ("scheduler", "runtime") for x in layers):
        ap.error("--layers: scheduler and/or runtime")
    rows: list[dict[str, Any]] = []
    with w.quiet_logs():
        for layer in layers:
            fn = _scheduler_rounds if layer == "scheduler" else _runtime_rounds
            for policy in policies:
                for depth in depths:
                    times = anyio.run(fn, policy, depth, rounds_for(depth, args.requests))
                    rows.append(_row(layer, policy, depth, times))
    w.write(
        "overhead",
        rows,
        params={
            "depths": depths,
            "requests": args.requests,
            "policies": policies,
            "layers": layers,
            "logging": "structlog at warning level (info events filtered)",
        },
        out=args.out,
        columns=COLUMNS,
    )
