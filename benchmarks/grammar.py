"""`python -m benchmarks grammar`: what a grammar costs in decode speed, on SmolLM2, greedy.

For each of the five structured-output prompts (`tests.support.workloads.STRUCTURED_PROMPTS`: nested
objects, arrays, enums, optional fields, bounded numbers) a fresh conversation is answered with its JSON
schema as `response_format` (llama-server's grammar, applied as llama-server applies it), and the same
prompt without a grammar, generating the same number of tokens (`ignore_eos`). Decode tokens/s are
`generated / timings.decode`; the two are alternated `--repeat` times and the medians compared.

    python -m benchmarks grammar [--repeat 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import anyio

from benchmarks._report import emit
from runtime import Reply, Runtime
from runtime.llama.models import default_model_path
from tests.support.workloads import STRUCTURED_PROMPTS

COLUMNS = ["schema", "tokens", "tok_s_plain", "tok_s_grammar", "cost_pct", "spread_pct"]


def _rate(r: Reply) -> float:
    return r.usage.generated_tokens / r.timings.decode if r.timings.decode > 0 else 0.0


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with Runtime.open(default_model_path(), n_ctx=4096, n_threads=args.threads, cache_ram_mib=0) as rt:
        for i, (prompt, schema) in enumerate(STRUCTURED_PROMPTS):
            msgs = [{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": prompt}]
            plain: list[float] = []
            constrained: list[float] = []
            n = 0
            for _ in range(args.repeat):
                g = await rt.complete(msgs, response_format=schema, max_tokens=args.max_tokens, temperature=0.0)
                n = g.usage.generated_tokens
                p = await rt.complete(msgs, max_tokens=max(1, n), temperature=0.0, ignore_eos=True)
                constrained.append(_rate(g))
                plain.append(_rate(p))
            rp, rg = statistics.median(plain), statistics.median(constrained)
            spread = 100 * (max(constrained) - min(constrained)) / rg if rg else 0.0
            rows.append(
                {
                    "schema": i + 1,
                    "tokens": n,
                    "tok_s_plain": round(rp, 1),
                    "tok_s_grammar": round(rg, 1),
                    "cost_pct": round(100 * (1 - rg / rp), 1) if rp else 0.0,
                    "spread_pct": round(spread, 1),
                }
            )
    return rows


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks grammar", description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    rows = anyio.run(_run, args)
    emit(
        "grammar",
        rows,
        params=vars(args),
        columns=COLUMNS,
        out=None if args.out is None else Path(args.out) / "grammar.json",
    )
