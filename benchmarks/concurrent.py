"""`python -m benchmarks concurrent`: many sessions asking at once, one slot, for each scheduling policy.

`--sessions` tasks (64) start together; each streams `--turns` turns one after the other (closed loop:
it asks again as soon as its reply is done), greedy, `--max-tokens` tokens per reply (end of generation
ignored, so every reply costs the same). The model is a tiny generated llama (`tests.support.tiny_models.write_llama`,
in a temporary directory) unless `--model PATH` (or `--model smollm2`) names a GGUF file.

Per policy (`fifo`, `affinity`):
- latency to the first text piece (`rt.stream`) and to the Reply, p50 and p99, from each request's submission;
- throughput: replies/s and generated tokens/s over the run;
- event-loop lag: a ticker task sleeps 10 ms again and again and records the overshoot (p99, max);
- fairness: `service_ratio` = max/min turns completed per session at the moment half of all replies were
  done (1.0 = equal service; empty when a session had none yet), `done_spread` = max/min of the
  sessions' finishing times, and the scheduler's `max_skips` (most times one request was passed over).

    python -m benchmarks concurrent [--sessions 64] [--turns 4] [--max-tokens 16] [--policies fifo,affinity]
                                    [--model PATH|smollm2] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from benchmarks import _cli, _rows
from benchmarks import _workload as w
from runtime import Reply, Runtime
from runtime.llama.models import default_model_path
from tests.support import workloads

COLUMNS = [
    "policy",
    "sessions",
    "replies",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "done_p50_ms",
    "done_p99_ms",
    "replies_s",
    "tokens_s",
    "loop_lag_p99_ms",
    "loop_lag_max_ms",
    "service_ratio",
    "done_spread",
    "max_skips",
    "wall_s",
]


@dataclass
class Run:
    """What the session tasks and the ticker recorded."""

    ttft: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    finished_at: dict[int, float] = field(default_factory=dict)  # session -> when its last reply came
    completions: list[int] = field(default_factory=list)  # session of each reply, in order of completion
    generated: int = 0
    lag: list[float] = field(default_factory=list)


async def _ticker(run: Run, stop: anyio.Event, period: float = 0.010) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await anyio.sleep(period)
        run.lag.append(max(0.0, time.perf_counter() - t0 - period))


async def _session(rt: Runtime, s: int, turns: int, sampling: dict[str, Any], run: Run, t_start: float) -> None:
    sid = f"s{s}"
    for t in range(turns):
        t0 = time.perf_counter()
        first: float | None = None
        reply: Reply | None = None
        async for item in rt.stream(sid, workloads.user_message(s, t), **sampling):  # read to the end
            if isinstance(item, Reply):
                reply = item
            elif first is None and item:
                first = time.perf_counter()
        end = time.perf_counter()
        assert reply is not None
        run.ttft.append((first or end) - t0)
        run.done.append(end - t0)
        run.generated += reply.usage.generated_tokens
        run.completions.append(s)
    run.finished_at[s] = time.perf_counter() - t_start


def _service_ratio(completions: list[int], n_sessions: int) -> float | None:
    half = completions[: len(completions) // 2]
    counts = [half.count(s) for s in range(n_sessions)]
    return round(max(counts) / min(counts), 3) if counts and min(counts) > 0 else None


async def _run_policy(model: Path, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    sampling = {"temperature": 0.0, "seed": w.SEED, "max_tokens": args.max_tokens, "ignore_eos": True}
    run = Run()
    async with Runtime.open(
        model,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        cache_ram_mib=args.cache_ram,
        policy=policy,
        max_queued=max(1024, 2 * args.sessions),
    ) as rt:
        for s in range(args.sessions):
            await rt.create_session(f"s{s}", system=workloads.persona(s)[0])
        stop = anyio.Event()
        async with anyio.create_task_group() as outer:
            outer.start_soon(_ticker, run, stop)
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for s in range(args.sessions):
                    tg.start_soon(_session, rt, s, args.turns, sampling, run, t0)
            wall = time.perf_counter() - t0
            stop.set()
        st = rt.stats()
    finish = list(run.finished_at.values())
    return {
        "policy": policy,
        "sessions": args.sessions,
        "replies": len(run.done),
        "ttft_p50_ms": round(1000 * _rows.percentile(run.ttft, 50), 2),
        "ttft_p99_ms": round(1000 * _rows.percentile(run.ttft, 99), 2),
        "done_p50_ms": round(1000 * _rows.percentile(run.done, 50), 2),
        "done_p99_ms": round(1000 * _rows.percentile(run.done, 99), 2),
        "replies_s": round(len(run.done) / wall, 2),
        "tokens_s": round(run.generated / wall, 1),
        "loop_lag_p99_ms": round(1000 * _rows.percentile(run.lag, 99), 2),
        "loop_lag_max_ms": round(1000 * max(run.lag, default=0.0), 2),
        "service_ratio": _service_ratio(run.completions, args.sessions),
        "done_spread": round(max(finish) / min(finish), 3) if finish and min(finish) > 0 else None,
        "max_skips": st.scheduler.max_skips,
        "wall_s": round(wall, 3),
        "generated": run.generated,
        "swaps": st.slot.swaps,
        "ram_loads": st.slot.ram_loads,
        "prefilled": st.slot.prefilled_tokens,
        "lag_samples": len(run.lag),
    }


def _model(arg: str | None, tmp: str) -> Path:
    if arg is None:
        from tests.support.tiny_models import write_llama

        return write_llama(Path(tmp) / "tiny-llama.gguf")
    if arg.lower() == "smollm2":
        return default_model_path()
    return Path(arg)


def main(argv: list[str]) -> None:
    ap = _cli.parser("concurrent", __doc__)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=4, help="turns per session, asked one after the other")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per reply (end of generation ignored)")
    ap.add_argument("--policies", default="fifo,affinity")
    ap.add_argument("--model", default=None, help="GGUF file or 'smollm2' (default: a tiny generated llama)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=w.N_CTX)
    ap.add_argument("--cache-ram", type=int, default=None, help="RAM cache MiB (default: llama-server's rule)")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write concurrent.json")
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.turns < 1:
        ap.error("--sessions and --turns must be at least 1")
    policies = [p for p in args.policies.split(",") if p]
    rows: list[dict[str, Any]] = []
    with _cli.temp_dir("turnstile-concurrent-") as tmp:
        model = _model(args.model, tmp)
        for policy in policies:
            _cli.progress(f"{policy}: {args.sessions} sessions x {args.turns} turns")
            rows.append(anyio.run(_run_policy, model, policy, args))
    _cli.write(
        "concurrent",
        rows,
        params={
            "model": model.name,
            "sessions": args.sessions,
            "turns": args.turns,
            "max_tokens": args.max_tokens,
            "threads": args.threads,
            "n_ctx": args.n_ctx,
            "cache_ram_mib": args.cache_ram,
            "ticker_period_ms": 10,
        },
        out=args.out,
        columns=COLUMNS,
    )
