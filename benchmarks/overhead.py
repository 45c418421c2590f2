"""`python -m benchmarks overhead`: what the scheduler and the Runtime cost per request, with no model at all.

`runtime.testing.ScriptedBackend` stands in for llama.cpp: it renders a conversation to one token per
character and answers at once. Everything else is real: `Runtime.serve(...)` with an
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
from typing import Any

import anyio
import msgspec

from benchmarks import _cli, _rows
from runtime import Runtime
from runtime.loop.scheduler import Job, Scheduler
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

COLUMNS = ["layer", "policy", "queued", "rounds", "requests", "us_per_request", "us_p90_round", "total_s"]


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
    times: list[float] = []
    async with Runtime.serve(ScriptedBackend(), MemoryStore(), policy=policy, max_queued=max(1024, depth)) as rt:
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
        "us_p90_round": round(1e6 * _rows.percentile(per, 90), 1),
        "total_s": round(sum(times), 3),
    }


def main(argv: list[str]) -> None:
    ap = _cli.parser("overhead", __doc__)
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
    for layer in layers:
        fn = _scheduler_rounds if layer == "scheduler" else _runtime_rounds
        for policy in policies:
            for depth in depths:
                times = anyio.run(fn, policy, depth, rounds_for(depth, args.requests))
                rows.append(_row(layer, policy, depth, times))
    _cli.write(
        "overhead",
        rows,
        params={
            "depths": depths,
            "requests": args.requests,
            "policies": policies,
            "layers": layers,
            "logging": "the library default (stdlib loggers, WARNING)",
        },
        out=args.out,
        columns=COLUMNS,
    )
