"""`python -m benchmarks pause-cost`: what pausing a request costs on the slot, to choose the fair policy's quanta.

A pause costs one save of the paused state (the swap that lets the waiting turn in copies the slot's state to
the RAM tier) and one load when it resumes. For prompts of `--lengths` tokens on one model this measures:
the state's bytes, a save (`state_get` into the RAM tier's buffer) and a load (`state_set`) in ms (median of
`--reps`), one decode step and one n_batch prefill chunk in ms, and from those the prompt tokens prefilled in
the time of one decode step (the policy's `PREFILL_PER_STEP`) and a pause's cost in decode steps.

    python -m benchmarks pause-cost [--model GGUF] [--lengths 128,1024,4096] [--threads 2]
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks import _cli, _timing
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path

COLUMNS = ["tokens", "state_mib", "save_ms", "load_ms", "pause_ms", "step_ms", "chunk_ms", "prefill_per_step",
           "pause_steps"]  # fmt: skip


def measure(eng: Engine, n: int, reps: int) -> dict[str, Any]:
    tokens = [eng.tokenize(" the boat brought crates", add_special=False)[i % 4] for i in range(n)]
    eng.seq_rm(-1, -1)
    t = time.perf_counter()
    for start in range(0, n, eng.n_batch):
        eng.decode(tokens[start : start + eng.n_batch], start)
    prefill_s = time.perf_counter() - t
    chunk_ms = 1000 * prefill_s / max(1, -(-n // eng.n_batch))
    saved: list[bytes] = []
    save_ms = _timing.median_ms(lambda: saved.append(bytes(eng.state_get())), reps)
    data = saved[-1]
    load_ms = _timing.median_ms(lambda: eng.state_set(data), reps)
    pos = [n]

    def step() -> None:
        eng.decode([tokens[0]], pos[0])
        pos[0] += 1

    step_ms = _timing.median_ms(step, reps)
    per_step = round(n / (1000 * prefill_s) * step_ms, 1)
    return {
        "tokens": n,
        "state_mib": round(len(data) / 2**20, 2),
        "save_ms": round(save_ms, 2),
        "load_ms": round(load_ms, 2),
        "pause_ms": round(save_ms + load_ms, 2),
        "step_ms": round(step_ms, 2),
        "chunk_ms": round(chunk_ms, 1),
        "prefill_per_step": per_step,
        "pause_steps": round((save_ms + load_ms) / step_ms, 2),
        "bytes_per_token": round(len(data) / n),
    }


def main(argv: list[str]) -> None:
    ap = _cli.parser("pause-cost", __doc__)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--lengths", default="128,1024,4096", help="comma-separated prompt lengths in tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write pause-cost.json")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    model = Path(args.model) if args.model else default_model_path()
    cfg = EngineConfig(
        n_ctx=max(lengths) + 2 * args.reps + 64,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=args.n_batch,
        n_ubatch=args.n_batch,
        flash_attn=True,
    )
    eng = Engine(model, cfg)
    try:
        rows = [measure(eng, n, args.reps) for n in lengths]
    finally:
        eng.close()
    _cli.write(
        "pause-cost",
        rows,
        params={
            "model": model.name,
            "threads": args.threads,
            "n_batch": args.n_batch,
            "reps": args.reps,
            "load_avg": [round(x, 2) for x in os.getloadavg()],
            "command": "python -m benchmarks pause-cost " + " ".join(argv),
        },
        out=args.out,
        columns=COLUMNS,
    )
