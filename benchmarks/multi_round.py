"""`python -m benchmarks multi-round`: many users sharing a long system prompt, closed loop, several rounds.

`--users` users start together; each asks `--rounds` questions one after the other (closed loop: the
next as soon as its answer is complete), its history built from its own answers, every answer exactly
`--answer-tokens` tokens (greedy, end of generation ignored). Every user has the same long system
prompt (`--system-tokens`, ~1,200). Systems, all with the same per-conversation context (`--n-ctx`),
threads, n_batch 2048, n_ubatch 512 and flash attention:

- turnstile: a `Runtime` (one slot, RAM prompt cache by llama-server's rule), users as anyio tasks
  streaming with `rt.stream`;
- llama-server `-np 1` (`--cache-ram` 8192) and llama-server with its default slots (`-np 4`, each
  slot `--n-ctx` tokens: `-c 4 x n_ctx`), users as threads streaming `/v1/chat/completions`
  (when `--llama-server BIN` is given).

TTFT is measured by the client from sending a request to its first streamed text; tokens/s is the
answer tokens of the run over its wall time. The systems alternate over `--runs` runs (this machine is
shared and noisy); the table gives each system's median over the runs and the spread (min-max).

    python -m benchmarks multi-round [--users 8] [--rounds 4] [--answer-tokens 32] [--system-tokens 1200]
                                     [--runs 2] [--llama-server BIN] [--systems turnstile,server-np1,server-np4]
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from benchmarks import _cli, _rows
from benchmarks import _workload as w
from runtime import Reply, Runtime
from runtime.llama.models import default_model_path
from tests.support.llama_server import LlamaServer

SYSTEMS = ("turnstile", "server-np1", "server-np4")
COLUMNS = [
    "system",
    "runs",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tokens_s",
    "tokens_s_spread",
    "ttft_p50_spread",
    "wall_s",
    "answers",
]
QUESTIONS = [
    "What is the first rule of the harbour?",
    "Who may enter the lighthouse?",
    "When do the ferries leave?",
    "What should a visitor do in a storm?",
    "Where are the fishing nets stored?",
    "Who keeps the tide tables?",
    "What happens at the evening bell?",
    "How are repairs reported?",
]


def system_prompt(n_tokens: int, count: Callable[[str], int]) -> str:
    """A long set of house rules of about `n_tokens` tokens (at most)."""
    rules = [
        "You are the harbour assistant of a small fishing town. Answer briefly and politely.",
    ]
    i = 0
    while count(" ".join(rules)) < n_tokens:
        i += 1
        rules.append(
            f"Rule {i}: boats of berth {i % 17} leave after the {i % 5 + 1}th bell, the keeper records "
            f"crates {i * 3} to {i * 3 + 2}, and visitors stay behind the {['red', 'blue', 'white'][i % 3]} line."
        )
    while count(" ".join(rules)) > n_tokens:
        rules.pop()
    return " ".join(rules)


@dataclass
class Run:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    answers: int = 0
    wall: float = 0.0


def _question(user: int, rnd: int) -> str:
    return f"{QUESTIONS[(user + rnd) % len(QUESTIONS)]} (user {user}, question {rnd + 1})"


# --- turnstile ---------------------------------------------------------------------------------------


async def _turnstile_user(rt: Runtime, user: int, args: Any, run: Run) -> None:
    sampling = {"temperature": 0.0, "seed": w.SEED, "max_tokens": args.answer_tokens, "ignore_eos": True}
    for rnd in range(args.rounds):
        t0 = time.perf_counter()
        first: float | None = None
        reply: Reply | None = None
        async for item in rt.stream(f"u{user}", _question(user, rnd), **sampling):
            if isinstance(item, Reply):
                reply = item
            elif first is None and item:
                first = time.perf_counter()
        assert reply is not None
        run.ttft.append((first or time.perf_counter()) - t0)
        run.tokens += reply.usage.generated_tokens
        run.answers += 1


async def _turnstile_run(model: Path, system: str, args: Any) -> Run:
    run = Run()
    async with Runtime.open(
        model,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=w.N_BATCH,
        n_ubatch=w.N_UBATCH,
        flash_attn=True,
        max_queued=max(1024, 2 * args.users),
    ) as rt:
        for u in range(args.users):
            await rt.create_session(f"u{u}", system=system)
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for u in range(args.users):
                tg.start_soon(_turnstile_user, rt, u, args, run)
        run.wall = time.perf_counter() - t0
    return run


# --- llama-server --------------------------------------------------------------------------------------


def _stream_chat(url: str, messages: list[dict[str, str]], args: Any) -> tuple[str, float | None, int]:
    """POST a streamed chat completion; (text, seconds to the first text, completion tokens)."""
    body = {
        "messages": messages,
        "max_tokens": args.answer_tokens,
        "temperature": 0.0,
        "seed": w.SEED,
        "ignore_eos": True,
        "cache_prompt": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    if first is None:
                        first = time.perf_counter() - t0
                    text.append(piece)
            if chunk.get("usage"):
                tokens = int(chunk["usage"].get("completion_tokens", 0))
    return "".join(text), first, tokens


def _server_run(binary: str, model: Path, system: str, args: Any, slots: int) -> Run:
    run = Run()
    lock = threading.Lock()
    errors: list[BaseException] = []
    extra = ["-np", str(slots), "-c", str(slots * args.n_ctx)] if slots > 1 else []
    with LlamaServer(
        binary, model, n_ctx=args.n_ctx, threads=args.threads, cache_ram_mib=8192, extra_args=extra, seed=w.SEED
    ) as srv:

        def user(u: int) -> None:
            msgs: list[dict[str, str]] = [{"role": "system", "content": system}]
            try:
                for rnd in range(args.rounds):
                    msgs.append({"role": "user", "content": _question(u, rnd)})
                    t0 = time.perf_counter()
                    text, first, tokens = _stream_chat(srv.url, msgs, args)
                    msgs.append({"role": "assistant", "content": text})
                    with lock:
                        run.ttft.append(first if first is not None else time.perf_counter() - t0)
                        run.tokens += tokens
                        run.answers += 1
            except BaseException as e:  # reported after the run
                with lock:
                    errors.append(e)

        threads = [threading.Thread(target=user, args=(u,)) for u in range(args.users)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        run.wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"llama-server run failed: {errors[0]!r}") from errors[0]
    return run


# --- the table -----------------------------------------------------------------------------------------


def _summary(label: str, runs: list[Run]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    tps = [r.tokens / r.wall for r in runs]
    p50 = [1000 * _rows.percentile(r.ttft, 50) for r in runs]
    return {
        "system": label,
        "runs": len(runs),
        "ttft_p50_ms": round(med(p50), 1),
        "ttft_p90_ms": round(med([1000 * _rows.percentile(r.ttft, 90) for r in runs]), 1),
        "ttft_p99_ms": round(med([1000 * _rows.percentile(r.ttft, 99) for r in runs]), 1),
        "tokens_s": round(med(tps), 2),
        "tokens_s_spread": f"{min(tps):.2f}-{max(tps):.2f}",
        "ttft_p50_spread": f"{min(p50):.0f}-{max(p50):.0f}",
        "wall_s": round(med([r.wall for r in runs]), 2),
        "answers": runs[0].answers,
        "per_run": [
            {
                "wall_s": round(r.wall, 3),
                "tokens": r.tokens,
                "tokens_s": round(r.tokens / r.wall, 2),
                "ttft_ms": [round(1000 * t, 1) for t in r.ttft],
            }
            for r in runs
        ],
    }


def main(argv: list[str]) -> None:
    ap = _cli.parser("multi-round", __doc__)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4, help="questions per user, asked one after the other")
    ap.add_argument("--answer-tokens", type=int, default=32, help="tokens per answer (end of generation ignored)")
    ap.add_argument("--system-tokens", type=int, default=1200, help="tokens of the shared system prompt")
    ap.add_argument("--runs", type=int, default=2, help="runs of each system, alternating")
    ap.add_argument("--n-ctx", type=int, default=4096, help="context per conversation (per slot for -np 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=None, metavar="BIN", help="a llama-server binary to compare with")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write multi-round.json")
    args = ap.parse_args(argv)
    if min(args.users, args.rounds, args.answer_tokens, args.runs) < 1:
        ap.error("--users, --rounds, --answer-tokens and --runs must be at least 1")
    _cli.check_binary(ap, args.llama_server)
    names = [n for n in _cli.systems_arg(ap, args.systems, SYSTEMS) if n == "turnstile" or args.llama_server]
    model = Path(args.model) if args.model else default_model_path()

    import llama_cpp

    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    system = system_prompt(args.system_tokens, lambda s: len(vocab.tokenize(s.encode(), add_bos=False)))
    vocab.close()

    labels = {"turnstile": "turnstile", "server-np1": "llama-server -np 1", "server-np4": "llama-server -np 4"}
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for i in range(args.runs):
        order = names[i % len(names) :] + names[: i % len(names)]  # alternate who goes first
        for n in order:
            _cli.progress(f"run {i + 1}/{args.runs}: {labels[n]}, {args.users} users x {args.rounds} rounds")
            if n == "turnstile":
                runs[n].append(anyio.run(_turnstile_run, model, system, args))
            else:
                runs[n].append(_server_run(args.llama_server, model, system, args, 1 if n == "server-np1" else 4))
    rows = [_summary(labels[n], runs[n]) for n in names]
    _cli.write(
        "multi-round",
        rows,
        params={
            "model": model.name,
            "users": args.users,
            "rounds": args.rounds,
            "answer_tokens": args.answer_tokens,
            "system_tokens": args.system_tokens,
            "runs": args.runs,
            "n_ctx": args.n_ctx,
            "threads": args.threads,
            "command": "python -m benchmarks multi-round " + " ".join(argv),
        },
        out=args.out,
        columns=COLUMNS,
    )
