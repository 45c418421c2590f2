"""`python -m benchmarks lookup-cost`: what a prefilled token costs against what loading a state costs.

The calibration behind `runtime.slot.lookup` (turnstile's rule: load a cached state only when the tokens it
keeps beyond the slot's are worth more prefill time than the load). On SmolLM2 (n_ctx 4096, llama-server's
batch settings), after a `--context` (1,500) token prompt already in the sequence:

- `prefill`: evaluating `k` more tokens (k in `--prefill`), seconds per token (the rule's unit);
- `save (state_get)`: copying the slot's state out (what a save costs) at each of `--states` token counts;
- `load, RAM whole`: `state_set` from a held buffer; `load, RAM blocks`: `BlockStore.get` + `state_set`;
- `load, disk`: `DiskTier.find` + decode + `state_set` (the file in the page cache, as after a recent spill).

Each load and save row is fitted as `fixed + bytes / rate` over the state sizes (least squares); the last
rows give the fit and, from it, how many prefilled tokens a load of one byte is worth.

    python -m benchmarks lookup-cost [--context 1500] [--prefill 16,64,256] [--states 256,1500,3000]
        [--repeat 5] [--threads 2]
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _cli, _timing
from benchmarks._workload import N_BATCH, N_UBATCH
from caches import kvstate
from caches.blocks import BlockStore
from caches.disk.tier import DiskTier
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path
from runtime.slot.shared import StateCodec
from runtime.slot.state import SlotState

COLUMNS = ["operation", "tokens", "MB", "median_ms", "best_ms", "per_token_ms", "GB_s"]
FIT_COLUMNS = ["operation", "fixed_ms", "GB_s", "bytes_per_prefill_token", "points"]


def _tokens(eng: Engine, n: int) -> list[int]:
    text = " ".join(f"note {i}: the keeper logged ship {i * 7} at dawn and checked the lamp." for i in range(n))
    return eng.tokenize(text, add_special=False)[:n]


def _decode(eng: Engine, tokens: list[int], pos: int) -> None:
    for start in range(0, len(tokens), eng.n_batch):
        eng.decode(tokens[start : start + eng.n_batch], pos + start, logits_last=True)


def _row(op: str, tokens: int, nbytes: int, times: list[float], per: int = 0) -> dict[str, Any]:
    med = statistics.median(times)
    return {
        "operation": op,
        "tokens": tokens,
        "MB": round(nbytes / 1e6, 2),
        "median_ms": round(1000 * med, 3),
        "best_ms": round(1000 * min(times), 3),
        "per_token_ms": round(1000 * med / per, 4) if per else "",
        "GB_s": round(nbytes / med / 1e9, 2) if nbytes else "",
        "times_ms": [round(1000 * t, 3) for t in times],
        "bytes": nbytes,
        "median_s": med,
    }


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares `seconds = fixed + bytes / rate`: (fixed seconds, bytes per second)."""
    xs, ys = [float(b) for b, _ in points], [t for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return max(0.0, my - slope * mx), (1.0 / slope if slope > 0 else float("inf"))


def measure(eng: Engine, args: Any, tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    memory = kvstate.memory_of(str(eng.kind), eng.n_swa)
    r = args.repeat
    longest = max([args.context + max(args.prefill), *args.states])
    tokens = _tokens(eng, longest)
    rows: list[dict[str, Any]] = []
    eng.clear()
    _decode(eng, tokens[: args.context], 0)
    for k in args.prefill:
        extra = tokens[args.context : args.context + k]
        times = _timing.times_s(
            lambda ex=extra: _decode(eng, ex, args.context), r, lambda: eng.seq_rm(args.context, -1)
        )
        rows.append(_row("prefill", k, 0, times, per=k))
    store = BlockStore(64, namespace=(eng.fingerprint + eng.settings_key).encode())
    disk = DiskTier(tmp / "disk", fingerprint=eng.fingerprint, settings=eng.settings_key, limit_bytes=0)
    codec = StateCodec(None)
    fits: dict[str, list[tuple[int, float]]] = {}
    for n in args.states:
        _cli.progress(f"states of {n} tokens")
        eng.clear()
        _decode(eng, tokens[:n], 0)
        save = _timing.times_s(lambda: bytes(eng.state_get()), r)  # a copy out, as a cache keeps it
        state = bytes(eng.state_get())
        size = len(state)
        ref = store.put(tokens[:n], state, memory)
        disk.put(tokens[:n], codec.encode(SlotState(state, ())))

        def from_disk(m: int = n) -> None:
            found = disk.find(tokens[:m])
            assert found is not None and len(found[0]) == m
            if not eng.state_set(codec.decode(found[1]).state):
                raise RuntimeError("llama.cpp refused the state from disk")

        measured = {
            "save (state_get)": save,
            "load, RAM whole": _timing.times_s(lambda s=state: eng.state_set(s), r),
            "load, RAM blocks": _timing.times_s(lambda rf=ref: eng.state_set(store.get(rf)), r),
            "load, disk": _timing.times_s(from_disk, r),
        }
        for op, times in measured.items():
            rows.append(_row(op, n, size, times))
            fits.setdefault(op, []).append((size, statistics.median(times)))
        store.release(ref)
    disk.close()
    prefill_s = next(row["median_s"] for row in rows if row["operation"] == "prefill" and row["tokens"] == 64) / 64
    fit_rows: list[dict[str, Any]] = []
    for op, pts in fits.items():
        fixed, rate = _fit(pts)
        fit_rows.append(
            {
                "operation": op,
                "fixed_ms": round(1000 * fixed, 3),
                "GB_s": round(rate / 1e9, 2),
                "bytes_per_prefill_token": int(rate * prefill_s),
                "points": len(pts),
                "fixed_s": fixed,
                "bytes_per_s": rate,
            }
        )
    fit_rows.append(
        {"operation": "prefill (64 after the context)", "fixed_ms": "", "GB_s": "", "bytes_per_prefill_token": ""}
        | {"points": 1, "seconds_per_token": prefill_s, "tokens_per_s": round(1 / prefill_s, 1)}
    )
    return rows, fit_rows


def main(argv: list[str]) -> None:
    ap = _cli.parser("lookup-cost", __doc__)
    ap.add_argument("--context", type=int, default=1500, help="tokens already in the sequence before a prefill")
    ap.add_argument("--prefill", default="16,64,256", help="prefill sizes (tokens), comma-separated")
    ap.add_argument("--states", default="256,1500,3000", help="state sizes (tokens) for saves and loads")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write the JSON")
    args = ap.parse_args(argv)
    args.prefill = [int(x) for x in args.prefill.split(",") if x]
    args.states = [int(x) for x in args.states.split(",") if x]
    if 64 not in args.prefill or len(args.states) < 2 or args.repeat < 1:
        ap.error("--prefill must include 64, --states needs two sizes, --repeat at least 1")
    model = Path(args.model) if args.model else default_model_path()
    cfg = EngineConfig(n_ctx=4096, n_threads=args.threads, n_batch=N_BATCH, n_ubatch=N_UBATCH)
    params = {
        "model": model.name,
        "context": args.context,
        "threads": args.threads,
        "repeat": args.repeat,
        "command": "python -m benchmarks lookup-cost " + " ".join(argv),
    }
    with Engine(model, cfg) as eng, tempfile.TemporaryDirectory(prefix="turnstile-lookup-") as tmp:
        rows, fit_rows = measure(eng, args, Path(tmp))
    _cli.write("lookup-cost", rows, params=params, out=args.out, columns=COLUMNS)
    _cli.write("lookup-cost-fit", fit_rows, params=params, out=args.out, columns=FIT_COLUMNS)
