"""`python -m benchmarks long-restart`: a long conversation resumed after a restart, its state from the disk tier
against recomputing it.

One conversation opens with a ~`--doc-tokens` (6,000) token document and a question, greedy, `--max-tokens`
per reply; then the process "restarts" (the Runtime is closed and opened again) and the conversation asks
its next question. The time to first token of that turn (the wall time of a 1-token reply: prefill + one
decode step) is measured for:

- turnstile + disk tier: the state written at close is read back and only the new question is prefilled;
- turnstile with the same sessions but the states removed (what a restart without a disk tier, or
  llama-server, must do): the whole conversation is prefilled again;
- llama-server `-np 1` restarted (when `--llama-server BIN` is given): the same, as a reference.

Each is run `--repeat` times, alternating, each on its own copy of the data_dir (a new Runtime each time);
the table gives the median and the spread. Tokens are exact: prompt, cached (reused) and prefilled.

    python -m benchmarks long-restart [--doc-tokens 6000] [--repeat 3] [--model PATH] [--llama-server BIN]
                                      [--cache-type f16] [-ngl N]
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from typing import Any

from benchmarks import _cli, long_context
from benchmarks import _workload as w
from tests.support.llama_server import LlamaServer

COLUMNS = ["system", "runs", "prompt_tokens", "cached", "prefilled", "ttft_s", "ttft_min_s", "ttft_max_s", "vs_disk"]
QUESTION = "Which place is mentioned most often?"
DISK = "turnstile + disk tier (state read back)"


def _open(settings: w.Settings, data_dir: str | None) -> Any:
    from runtime import Runtime

    return Runtime.open(
        settings.model,
        data_dir=data_dir,
        n_ctx=settings.n_ctx,
        n_threads=settings.threads,
        n_threads_batch=settings.threads,
        n_batch=w.N_BATCH,
        n_ubatch=w.N_UBATCH,
        **settings.runtime_options,
    )


async def _first_turn(settings: w.Settings, data_dir: str | None, doc: str) -> tuple[int, str]:
    async with _open(settings, data_dir) as rt:
        await rt.create_session("long", **settings.sampling)
        first = await rt.chat("long", f"{doc}\n\n{long_context.QUESTIONS[0]}")
        return first.usage.prompt_tokens, first.text


async def _resumed(settings: w.Settings, data_dir: str) -> dict[str, Any]:
    """Open a Runtime on `data_dir` (the sessions, and the disk tier's states unless they were removed), time a
    1-token reply of the conversation's next turn."""
    async with _open(settings, data_dir) as rt:
        t0 = time.perf_counter()
        r = await rt.chat("long", QUESTION, max_tokens=1)
        seconds = time.perf_counter() - t0
        u = r.usage
        return {"prompt": u.prompt_tokens, "cached": u.cached_tokens, "prefilled": u.prefilled_tokens, "s": seconds}


def _server(settings: w.Settings, binary: str, doc: str, reply: str) -> dict[str, Any]:
    msgs = [
        {"role": "user", "content": f"{doc}\n\n{long_context.QUESTIONS[0]}"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": QUESTION},
    ]
    with LlamaServer(
        binary,
        settings.model,
        n_ctx=settings.n_ctx,
        threads=settings.threads,
        cache_ram_mib=0,
        seed=settings.seed,
        extra_args=settings.server_args,
    ) as srv:
        t0 = time.perf_counter()
        r = srv.chat(msgs, max_tokens=1, temperature=0.0, seed=settings.seed)
        seconds = time.perf_counter() - t0
    return {"prompt": r.prompt_tokens, "cached": r.cache_n, "prefilled": r.prompt_n, "s": seconds}


def main(argv: list[str]) -> None:
    import anyio

    ap = _cli.parser("long-restart", __doc__)
    _cli.add_common_args(ap, conversations=1, turns=1)
    ap.add_argument("--doc-tokens", type=int, default=6000, help="tokens of the conversation's document")
    ap.add_argument("--repeat", type=int, default=3, help="resumptions of each system (alternating)")
    ap.set_defaults(n_ctx=8192, max_tokens=16)
    args = ap.parse_args(argv)
    _cli.check_binary(ap, args.llama_server)
    settings = _cli.settings_from(args)
    rows: list[dict[str, Any]] = []
    with _cli.temp_dir("turnstile-long-restart-") as tmp:

        async def count_tokens() -> str:
            async with _open(settings, None) as rt:
                backend = rt.backend
                return long_context.document(0, args.doc_tokens, lambda s: len(backend.tokenize(s)))

        doc = anyio.run(count_tokens)
        data_dir = os.path.join(tmp, "disk")
        _cli.progress(f"first turn: a {args.doc_tokens}-token document, state to {data_dir}")
        prompt, reply = anyio.run(_first_turn, settings, data_dir, doc)
        _cli.progress(f"first turn: {prompt} prompt tokens; now {args.repeat} resumptions of each system")
        runs: dict[str, list[dict[str, Any]]] = {}
        for k in range(args.repeat):  # each run on a copy of what the first turn left
            kept = os.path.join(tmp, f"kept-{k}")
            shutil.copytree(data_dir, kept)
            runs.setdefault(DISK, []).append(anyio.run(_resumed, settings, kept))
            dropped = os.path.join(tmp, f"dropped-{k}")
            shutil.copytree(data_dir, dropped)
            shutil.rmtree(os.path.join(dropped, "states"))  # the sessions stay, the states are gone
            runs.setdefault("turnstile, states removed (recompute)", []).append(anyio.run(_resumed, settings, dropped))
            if args.llama_server:
                runs.setdefault("llama-server restarted (recompute)", []).append(
                    _server(settings, args.llama_server, doc, reply)
                )
    disk = statistics.median(r["s"] for r in runs[DISK])
    for name, rs in runs.items():
        times = [r["s"] for r in rs]
        med = statistics.median(times)
        rows.append(
            {
                "system": name,
                "runs": len(rs),
                "prompt_tokens": rs[0]["prompt"],
                "cached": rs[0]["cached"],
                "prefilled": rs[0]["prefilled"],
                "ttft_s": round(med, 3),
                "ttft_min_s": round(min(times), 3),
                "ttft_max_s": round(max(times), 3),
                "vs_disk": round(med / disk, 1) if disk else 0.0,
            }
        )
    _cli.write(
        "long-restart",
        rows,
        params=_cli.common_params(args, settings) | {"doc_tokens": args.doc_tokens, "repeat": args.repeat},
        out=args.out,
        columns=COLUMNS,
    )
