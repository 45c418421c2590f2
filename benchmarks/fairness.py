"""`python -m benchmarks fairness`: one long document and 8 short turns arriving during its prefill, one slot.

One conversation sends a document of about `--doc-tokens` tokens (its prefill should take >= 10 s here) and
asks for `--long-tokens` tokens; `--shorts` other conversations (8) each send one short turn (a short system
prompt and a question, under 100 new tokens) asking for `--short-tokens` (48) tokens, greedy, end of
generation ignored. The short turns arrive during the long prefill: the first `--first` s (1.0) after the
long request, then one every `--gap` s (0.5). Systems, each with the same context per conversation
(`--n-ctx`), threads, `--n-batch` (512), `--n-ubatch` (512), flash attention. A prefill pauses only between two
n_batch chunks (so that its evaluation shapes are an unpaused prefill's); at llama-server's 2,048 a
3,000-token document has one such boundary, hence 512 here, for every system alike.

- turnstile `fifo`, turnstile `fair` (`--quantum`, `--decode-quantum` and `--abort-ms` ms; default the
  policy's own) and `fair-defer` (the same with `defer_replies=True`: replies that have their first token wait
  while the paused document waits), `rt.stream` per turn;
- llama-server `-np 1 --cache-ram 8192` and `-np 4` with 4x the context (`--llama-server BIN`), streamed
  `/v1/chat/completions` from threads.

Each system runs twice on a fresh instance: alone (the long request by itself, then the short turns one
after the other, each generating one token: their idle time to first token), and mixed (the workload
above). Reported: short-turn TTFT p50/p95/max (mixed) and their idle p50, the ratio p95 mixed / idle p50,
the short turns' p50/p95 time to their last token, the long request's total time mixed and alone and their
ratio, its bound on one slot (turnstile: alone + the short turns' slot work, with `fair-defer` their work up
to their first tokens, + the work of aborted chunks, over alone), total generated tokens per second over the
mixed run, prefill chunks aborted and the seconds they threw away, and whether the short turns' texts equal
those of turnstile `fifo` (greedy). Systems run one after the other in the order given (`--systems`).

    python -m benchmarks fairness [--doc-tokens 3000] [--shorts 8] [--llama-server BIN]
                                  [--systems fifo,server-np1,fair,fair-defer,server-np4] [--quantum MS]
"""

from __future__ import annotations

import json
import os
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
from runtime.loop.policy import Fair
from tests.support.llama_server import LlamaServer

SYSTEMS = ("fifo", "server-np1", "fair", "fair-defer", "server-np4")
LABELS = {
    "fifo": "turnstile fifo",
    "fair": "turnstile fair",
    "fair-defer": "turnstile fair, defer_replies",
    "server-np1": "llama-server -np 1",
    "server-np4": "llama-server -np 4",
}
COLUMNS = [
    "system",
    "short_ttft_p50_ms",
    "short_ttft_p95_ms",
    "short_ttft_max_ms",
    "idle_ttft_p50_ms",
    "p95_over_idle",
    "short_total_p95_s",
    "long_total_s",
    "long_alone_s",
    "long_ratio",
    "long_bound",
    "tokens_s",
    "pauses",
    "aborts",
    "aborted_s",
    "texts_equal_fifo",
    "wall_s",
]
SUBJECTS = ["the harbour", "the lighthouse", "the ferry", "a storm", "the nets", "the tides", "the bell", "repairs"]
LONG_SYSTEM = "You read long documents and answer questions about them."


def document(n_tokens: int, count: Callable[[str], int]) -> str:
    """A ledger of about `n_tokens` tokens (at most)."""
    lines: list[str] = []
    step = 64
    i = 0
    while True:
        block = [
            f"Entry {j}: the boat {j % 23} brought {j * 7 % 101} crates of {SUBJECTS[j % 8]} supplies on day {j % 31}."
            for j in range(i, i + step)
        ]
        if count(" ".join(lines + block)) > n_tokens:
            break
        lines += block
        i += step
    while count(" ".join(lines)) < n_tokens - 40:
        lines.append(f"Entry {i}: the boat {i % 23} brought {i * 7 % 101} crates.")
        i += 1
    return " ".join(lines)


def short_turn(i: int) -> tuple[str, str]:
    """(system, question) of short conversation `i`."""
    return (
        f"You are assistant {i} of a small fishing town. Answer in full sentences.",
        f"Tell me about {SUBJECTS[i % len(SUBJECTS)]} of the town and why it matters to the people there.",
    )


@dataclass
class Timed:
    text: str = ""
    ttft: float = 0.0
    total: float = 0.0
    tokens: int = 0
    work: float | None = None  # seconds the slot worked on it (cache + prefill + decode; turnstile only)
    first_work: float | None = None  # of those, the work up to its first token (its decode's first step)


@dataclass
class Run:
    shorts: dict[int, Timed] = field(default_factory=dict)
    long: Timed = field(default_factory=Timed)
    wall: float = 0.0
    pauses: int = 0
    decode_pauses: int = 0
    aborts: int = 0  # prefill chunks aborted for a waiting turn
    aborted_tokens: int = 0
    aborted_s: float = 0.0  # the work those chunks threw away


# --- turnstile ---------------------------------------------------------------------------------------------


async def _turn(rt: Runtime, sid: str, message: str, max_tokens: int) -> Timed:
    sampling: dict[str, Any] = {"temperature": 0.0, "seed": w.SEED, "max_tokens": max_tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    first: float | None = None
    reply: Reply | None = None
    async for item in rt.stream(sid, message, **sampling):
        if isinstance(item, Reply):
            reply = item
        elif first is None and item:
            first = time.perf_counter()
    end = time.perf_counter()
    assert reply is not None
    t = reply.timings
    n = reply.usage.generated_tokens
    first_work = t.cache + t.prefill + t.decode / max(1, n)
    return Timed(reply.text, (first or end) - t0, end - t0, n, t.cache + t.prefill + t.decode, first_work)


async def _turnstile(model: Path, system: str, doc: str, args: Any, mixed: bool) -> Run:
    run = Run()
    policy = "fair" if system.startswith("fair") else system
    async with Runtime.open(
        model,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=args.n_batch,
        n_ubatch=args.n_ubatch,
        flash_attn=True,
        policy=policy,
        prefill_quantum_ms=args.quantum if policy == "fair" else None,
        decode_quantum_ms=args.decode_quantum if policy == "fair" else None,
        prefill_abort_ms=args.abort_ms if policy == "fair" else None,
        defer_replies=system == "fair-defer",
    ) as rt:
        if policy == "fair" and args.max_aborts is not None:
            fair = rt.scheduler.policy
            assert isinstance(fair, Fair)
            fair.max_aborts = args.max_aborts  # before any job: the policy's option, not the config's
        await rt.create_session("long", system=LONG_SYSTEM)
        for i in range(args.shorts):
            await rt.create_session(f"s{i}", system=short_turn(i)[0])

        async def long() -> None:
            run.long = await _turn(rt, "long", f"{doc}\n\nWhich boat brought the most crates?", args.long_tokens)

        async def short(i: int, at: float, t0: float) -> None:
            await anyio.sleep(max(0.0, t0 + at - time.perf_counter()))
            run.shorts[i] = await _turn(rt, f"s{i}", short_turn(i)[1], args.short_tokens)

        t0 = time.perf_counter()
        if mixed:
            async with anyio.create_task_group() as tg:
                tg.start_soon(long)
                for i in range(args.shorts):
                    tg.start_soon(short, i, args.first + i * args.gap, t0)
        else:
            await long()
            for i in range(args.shorts):
                run.shorts[i] = await _turn(rt, f"s{i}", short_turn(i)[1], 1)
        run.wall = time.perf_counter() - t0
        run.pauses = rt.stats().scheduler.pauses
        st = rt.stats().scheduler
        run.decode_pauses = st.decode_pauses
        run.aborts, run.aborted_tokens, run.aborted_s = st.prefill_aborts, st.aborted_tokens, st.aborted_seconds
    return run


# --- llama-server ----------------------------------------------------------------------------------------


def _stream(url: str, messages: list[dict[str, str]], max_tokens: int) -> Timed:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
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
    out = Timed()
    first: float | None = None
    pieces: list[str] = []
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    pieces.append(piece)
            if chunk.get("usage"):
                out.tokens = int(chunk["usage"].get("completion_tokens", 0))
    out.total = time.perf_counter() - t0
    out.ttft = first if first is not None else out.total
    out.text = "".join(pieces)
    return out


def _server(binary: str, model: Path, slots: int, doc: str, args: Any, mixed: bool) -> Run:
    run = Run()
    errors: list[BaseException] = []
    extra = ["-np", str(slots), "-c", str(slots * args.n_ctx)] if slots > 1 else []
    with LlamaServer(
        binary,
        model,
        n_ctx=args.n_ctx,
        threads=args.threads,
        cache_ram_mib=8192,
        extra_args=extra,
        seed=w.SEED,
        n_batch=args.n_batch,
        n_ubatch=args.n_ubatch,
    ) as srv:

        def long() -> None:
            msgs = [
                {"role": "system", "content": LONG_SYSTEM},
                {"role": "user", "content": f"{doc}\n\nWhich boat brought the most crates?"},
            ]
            run.long = _stream(srv.url, msgs, args.long_tokens)

        def short(i: int, at: float, t0: float, n: int = args.short_tokens) -> None:
            time.sleep(max(0.0, t0 + at - time.perf_counter()))
            system, question = short_turn(i)
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            run.shorts[i] = _stream(srv.url, msgs, n)

        def guarded(fn: Callable[..., None], *a: Any) -> Callable[[], None]:
            def go() -> None:
                try:
                    fn(*a)
                except BaseException as e:  # reported after the run
                    errors.append(e)

            return go

        t0 = time.perf_counter()
        if mixed:
            threads = [threading.Thread(target=guarded(long))]
            threads += [
                threading.Thread(target=guarded(short, i, args.first + i * args.gap, t0)) for i in range(args.shorts)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            long()
            for i in range(args.shorts):
                short(i, 0.0, time.perf_counter(), 1)
        run.wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"llama-server run failed: {errors[0]!r}") from errors[0]
    return run


# --- the table -------------------------------------------------------------------------------------------


def _row(name: str, alone: Run, mixed: Run, fifo: Run | None) -> dict[str, Any]:
    ttft = [t.ttft for t in mixed.shorts.values()]
    idle = [t.ttft for t in alone.shorts.values()]
    totals = [t.total for t in mixed.shorts.values()]  # each short turn's time to its last token
    idle_p50 = _rows.percentile(idle, 50)
    p95 = _rows.percentile(ttft, 95)
    generated = mixed.long.tokens + sum(t.tokens for t in mixed.shorts.values())
    # on one slot the long request ends no earlier than alone + the short turns' work + the work thrown away;
    # with deferred replies only their work up to the first token must come before it
    works = [t.first_work if name == "fair-defer" else t.work for t in mixed.shorts.values()]
    bound = None
    if alone.long.total and all(x is not None for x in works):
        bound = round((alone.long.total + sum(x or 0.0 for x in works) + mixed.aborted_s) / alone.long.total, 3)
    same = None
    if fifo is not None:
        same = all(mixed.shorts[i].text == fifo.shorts[i].text for i in mixed.shorts)
    return {
        "system": LABELS[name],
        "short_ttft_p50_ms": round(1000 * _rows.percentile(ttft, 50), 1),
        "short_ttft_p95_ms": round(1000 * p95, 1),
        "short_ttft_max_ms": round(1000 * max(ttft, default=0.0), 1),
        "idle_ttft_p50_ms": round(1000 * idle_p50, 1),
        "p95_over_idle": round(p95 / idle_p50, 2) if idle_p50 else None,
        "short_total_p50_s": round(_rows.percentile(totals, 50), 2),
        "short_total_p95_s": round(_rows.percentile(totals, 95), 2),
        "long_total_s": round(mixed.long.total, 2),
        "long_alone_s": round(alone.long.total, 2),
        "long_ratio": round(mixed.long.total / alone.long.total, 3) if alone.long.total else None,
        "long_bound": bound,
        "shorts_work_s": round(sum(x or 0.0 for x in works), 2) if bound is not None else None,
        "tokens_s": round(generated / mixed.wall, 2) if mixed.wall else None,
        "pauses": mixed.pauses,
        "decode_pauses": mixed.decode_pauses,
        "aborts": mixed.aborts,
        "aborted_tokens": mixed.aborted_tokens,
        "aborted_s": round(mixed.aborted_s, 2),
        "texts_equal_fifo": same,
        "wall_s": round(mixed.wall, 2),
        "short_ttft_ms": [round(1000 * mixed.shorts[i].ttft, 1) for i in sorted(mixed.shorts)],
        "idle_ttft_ms": [round(1000 * alone.shorts[i].ttft, 1) for i in sorted(alone.shorts)],
        "long_ttft_s": round(mixed.long.ttft, 2),
        "long_alone_ttft_s": round(alone.long.ttft, 2),
        "short_texts": [mixed.shorts[i].text for i in sorted(mixed.shorts)],
    }


def main(argv: list[str]) -> None:
    ap = _cli.parser("fairness", __doc__)
    ap.add_argument("--doc-tokens", type=int, default=3000, help="tokens of the long document (about)")
    ap.add_argument("--shorts", type=int, default=8, help="short conversations arriving during the long prefill")
    ap.add_argument("--short-tokens", type=int, default=48, help="tokens each short turn generates")
    ap.add_argument("--long-tokens", type=int, default=16, help="tokens the long request generates")
    ap.add_argument("--first", type=float, default=1.0, help="seconds after the long request the first short comes")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between two short turns' arrivals")
    ap.add_argument("--quantum", type=float, default=None, metavar="MS", help="fair: prefill quantum (policy default)")
    ap.add_argument("--decode-quantum", type=float, default=None, metavar="MS", help="fair: decode quantum (inf: none)")
    ap.add_argument(
        "--abort-ms", type=float, default=None, metavar="MS", help="fair: prefill_abort_ms (policy default; inf: never)"
    )
    ap.add_argument("--max-aborts", type=int, default=None, metavar="N", help="fair: times one chunk may be aborted")
    ap.add_argument("--n-ctx", type=int, default=8192, help="context per conversation (per slot for -np 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512, help="n_batch of every system (pause points)")
    ap.add_argument("--n-ubatch", type=int, default=w.N_UBATCH, help="n_ubatch of every system (an abort keeps those)")
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=None, metavar="BIN", help="a llama-server binary to compare with")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write fairness.json")
    args = ap.parse_args(argv)
    if min(args.doc_tokens, args.shorts, args.short_tokens, args.long_tokens) < 1:
        ap.error("--doc-tokens, --shorts, --short-tokens and --long-tokens must be at least 1")
    _cli.check_binary(ap, args.llama_server)
    names = [n for n in _cli.systems_arg(ap, args.systems, SYSTEMS) if not n.startswith("server") or args.llama_server]
    model = Path(args.model) if args.model else default_model_path()

    import llama_cpp

    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    doc = document(args.doc_tokens, lambda s: len(vocab.tokenize(s.encode(), add_bos=False)))
    n_doc = len(vocab.tokenize(doc.encode(), add_bos=False))
    vocab.close()

    runs: dict[str, tuple[Run, Run]] = {}
    for n in names:
        pair: list[Run] = []
        for mixed in (False, True):
            _cli.progress(f"{LABELS[n]}: {'mixed' if mixed else 'alone'} (load {os.getloadavg()[0]:.2f})")
            if not n.startswith("server"):
                pair.append(anyio.run(_turnstile, model, n, doc, args, mixed))
            else:
                assert args.llama_server is not None
                pair.append(_server(args.llama_server, model, 1 if n == "server-np1" else 4, doc, args, mixed))
        runs[n] = (pair[0], pair[1])
    fifo = runs["fifo"][1] if "fifo" in runs else None
    rows = [_row(n, *runs[n], fifo) for n in names]
    _cli.write(
        "fairness",
        rows,
        params={
            "model": model.name,
            "doc_tokens": n_doc,
            "shorts": args.shorts,
            "short_tokens": args.short_tokens,
            "long_tokens": args.long_tokens,
            "first_s": args.first,
            "gap_s": args.gap,
            "quantum_ms": args.quantum,
            "decode_quantum_ms": args.decode_quantum,
            "prefill_abort_ms": args.abort_ms,
            "max_aborts": args.max_aborts,
            "n_ctx": args.n_ctx,
            "threads": args.threads,
            "n_batch": args.n_batch,
            "n_ubatch": args.n_ubatch,
            "load_avg": [round(x, 2) for x in os.getloadavg()],
            "command": "python -m benchmarks fairness " + " ".join(argv),
        },
        out=args.out,
        columns=COLUMNS,
    )
