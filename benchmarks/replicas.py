"""`python -m benchmarks replicas`: turnstile on Ray Serve, 1 and 2 replicas, affinity vs Ray's default routing.

The multi-round workload: `--users` users, each resending its whole history every round (stateless OpenAI
requests, as clients do) for `--rounds` rounds, greedy, `--max-tokens` per reply; `--concurrency` requests
are in flight at any time (two per replica by default), each taken by the user that has waited longest, so
the request after a reply is usually another user's (as with many users and think time between turns). Every
replica has one slot, one llama.cpp thread and a RAM prompt cache of `--cache-ram` MiB (no disk tier), the
per-node budget: with affinity each replica keeps the states of its share of the users; with Ray's
power-of-two-choices routing each replica sees every user, needs room for all their states, and recomputes
what it lacks. Reported per setup: tokens prefilled (prompt - cached, summed over requests), wall time,
requests per replica and how many conversations ever changed replica.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter, defaultdict
from typing import Any

import httpx2 as httpx

from benchmarks._cli import write
from runtime.llama.models import default_model_path
from tests.support.workloads import persona

COLUMNS = [
    "replicas",
    "routing",
    "requests",
    "prompt_tokens",
    "prefilled",
    "prefilled_vs_affinity",
    "wall_s",
    "wall_vs_1",
    "per_replica",
    "moved_convs",
]


class _Users:
    """Every user's history; `ready` holds the users whose next turn may be sent, in the order they became ready."""

    def __init__(self, users: int, rounds: int, workers: int) -> None:
        self.rounds = rounds
        self.workers = workers
        self.history: dict[int, list[dict[str, str]]] = {}
        self.questions: dict[int, list[str]] = {}
        self.done: dict[int, int] = dict.fromkeys(range(users), 0)
        self.ready: asyncio.Queue[int | None] = asyncio.Queue()
        for u in range(users):
            system, self.questions[u] = persona(u)
            self.history[u] = [{"role": "system", "content": system}]
            self.ready.put_nowait(u)
        self.left = users * rounds


async def _worker(client: httpx.AsyncClient, users: _Users, max_tokens: int, out: list[dict[str, Any]]) -> None:
    while (u := await users.ready.get()) is not None:
        messages = users.history[u]
        questions = users.questions[u]
        messages.append({"role": "user", "content": questions[users.done[u] % len(questions)]})
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
        resp = await client.post("/v1/chat/completions", json=body)
        resp.raise_for_status()
        data = resp.json()
        messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
        usage = data["usage"]
        out.append(
            {
                "conv": u,
                "replica": resp.headers["x-turnstile-replica"],
                "prompt": usage["prompt_tokens"],
                "cached": usage["prompt_tokens_details"]["cached_tokens"],
            }
        )
        users.done[u] += 1
        users.left -= 1
        if users.done[u] < users.rounds:
            users.ready.put_nowait(u)  # behind the users already waiting: the next request is someone else's
        if users.left == 0:
            for _ in range(users.workers):
                users.ready.put_nowait(None)


async def _workload(
    url: str, users: int, rounds: int, max_tokens: int, concurrency: int
) -> tuple[list[dict[str, Any]], float]:
    out: list[dict[str, Any]] = []
    state = _Users(users, rounds, concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(_worker(client, state, max_tokens, out) for _ in range(concurrency)))
        return out, time.perf_counter() - start


def _row(replicas: int, routing: str, records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    where: dict[int, set[str]] = defaultdict(set)
    for r in records:
        where[r["conv"]].add(r["replica"])
    spread = Counter(r["replica"] for r in records)
    return {
        "replicas": replicas,
        "routing": routing,
        "requests": len(records),
        "prompt_tokens": sum(r["prompt"] for r in records),
        "prefilled": sum(r["prompt"] - r["cached"] for r in records),
        "wall_s": round(wall, 2),
        "per_replica": "/".join(str(n) for n in sorted(spread.values(), reverse=True)),
        "moved_convs": sum(1 for s in where.values() if len(s) > 1),
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks replicas", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF model (default SmolLM2-135M)")
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--cache-ram", type=int, default=128, metavar="MIB", help="RAM prompt cache per replica (128)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads per replica (1)")
    p.add_argument("--setups", default="1:affinity,2:affinity,2:default", help="REPLICAS:ROUTING,...")
    p.add_argument("--out", default=None, metavar="DIR", help="where to write replicas.json")
    args = p.parse_args(argv)

    import ray
    from ray import serve

    from runtime.serve.cluster import ray as cluster
    from tests.support.redis_server import free_port

    model = str(args.model or default_model_path())
    options = {"model": model, "n_ctx": 4096, "n_threads": args.threads, "cache_ram_mib": args.cache_ram}
    rows: list[dict[str, Any]] = []
    port = free_port()
    for setup in args.setups.split(","):
        n, routing = setup.split(":")
        app = cluster.application(
            options,
            replicas=int(n),
            routing=routing,
            num_cpus_per_replica=1,
        )
        url = cluster.start(app, port=port, name="bench", num_cpus=max(2, os.cpu_count() or 2))
        try:
            records, wall = asyncio.run(_workload(url, args.users, args.rounds, args.max_tokens, args.concurrency))
        finally:
            serve.delete("bench")
        rows.append(_row(int(n), routing, records, wall))
        print(rows[-1], flush=True)
    base = next((r for r in rows if r["replicas"] == 1), None)
    for r in rows:
        same = next((a for a in rows if a["replicas"] == r["replicas"] and a["routing"] == "affinity"), None)
        r["prefilled_vs_affinity"] = round(r["prefilled"] / same["prefilled"], 2) if same else ""
        r["wall_vs_1"] = round(r["wall_s"] / base["wall_s"], 2) if base else ""
    serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()
    params = {k: getattr(args, k) for k in ("users", "rounds", "max_tokens", "concurrency", "cache_ram", "threads")}
    params |= {"model": os.path.basename(model), "command": "python -m benchmarks replicas " + " ".join(argv)}
    write("replicas", rows, params=params, out=args.out, columns=COLUMNS)
