"""`python -m benchmarks decode`: plain (unspeculated, greedy) decode speed per step, and where a step's time goes.

One workload: the speculative benchmark's copy prompt (a 120-word passage asked back word for word), its
prompt cached by a warm-up request, then `--runs` measured requests of up to `--max-tokens` tokens. Systems:

- `turnstile`: a `Runtime` (`complete`, the slot thread's decode loop: sample, detokenize, stop check);
- `engine loop`: `runtime.llama.Engine` alone (decode one token, argmax, until EOS or the limit; the
  speculative benchmark's `Bare`);
- `llama-server`: `-np 1 --spec-type none` (with `--llama-server BIN`).

Every repetition plays each system in turn (the order alternates between repetitions; a system is opened for
its play and closed after it, so one llama.cpp context decodes at a time), for each `--threads` value.

The rate is per decode *step*: one one-token `llama_decode` after the first generated token. llama-server's
`predicted_ms` runs from sampling the first token to sampling the last, n-1 steps for `predicted_n` = n
tokens, so its `predicted_per_second` (n / predicted_ms) overstates the step rate by n/(n-1); every system
here is timed over the same n-1 steps (turnstile: from its first token, `timings.first_token`, to the end of
the run; the engine loop: from its first argmax to its last).

The split (per step, ms): `llama_decode` (graph compute and the logits' copy out of the backend: one C call),
`sample` (turnstile's `Sampler.sample`, an argmax on the logits in place for greedy; the engine loop's argmax)
and `python` (the rest: detokenization, stop matching, the loop). turnstile's split is measured by timing
wrappers around `Engine.decode` and `Sampler.sample` (a few hundred ns per call); llama-server's is not
visible from outside (its total only). `cpu_ms` is the process's CPU time per step (user + system, all its
threads; with 2 threads it includes the OpenMP worker's spin-waits), which load disturbs less than wall time.

    python -m benchmarks decode [--reps 5] [--runs 2] [--max-tokens 128] [--threads 2,1]
                                [--llama-server BIN] [--systems turnstile,engine,server] [--out DIR]
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import _cli
from benchmarks import _workload as w
from benchmarks.speculative import COPY_SYSTEM, COPY_USER, Bare, Server, Turnstile
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path
from runtime.llama.sampler import Sampler

MESSAGES = [{"role": "system", "content": COPY_SYSTEM}, {"role": "user", "content": COPY_USER}]


@dataclass
class Clock:
    """(wall, thread CPU) seconds of each wrapped call on the slot thread (turnstile's split), per request."""

    decode: list[tuple[float, float]] = field(default_factory=list)
    sample: list[tuple[float, float]] = field(default_factory=list)
    loop: tuple[float, float] = (0.0, 0.0)  # the decode loop (`Generation.run`) as a whole

    def reset(self) -> None:
        self.decode.clear()
        self.sample.clear()
        self.loop = (0.0, 0.0)

    def split(self, steps: int) -> tuple[float, float, float]:
        """(llama_decode, sample, python CPU) seconds for the loop's `steps` steps: the last `steps` decode calls
        and sample calls (the prefill's and the first token's come before), and the loop's thread CPU time
        outside every decode and sample call in it."""
        decode = sum(w for w, _ in self.decode[len(self.decode) - steps :])
        sample = sum(w for w, _ in self.sample[len(self.sample) - steps :])
        in_calls = sum(c for _, c in self.decode[len(self.decode) - steps :]) + sum(
            c for _, c in self.sample[-steps - 1 :]
        )
        return decode, sample, self.loop[1] - in_calls


CLOCK = Clock()


def _timed(record: Callable[[tuple[float, float]], None], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        w, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            record((time.perf_counter() - w, time.thread_time() - c))

    return wrapper


@contextmanager
def timed_calls() -> Iterator[None]:
    """Time `Engine.decode`, `Sampler.sample` and the decode loop (restored at the end)."""
    from runtime.slot.decode import Generation

    decode, sample, loop = Engine.decode, Sampler.sample, Generation.run

    def set_loop(t: tuple[float, float]) -> None:
        CLOCK.loop = t

    Engine.decode = _timed(CLOCK.decode.append, decode)  # type: ignore[method-assign]
    Sampler.sample = _timed(CLOCK.sample.append, sample)  # type: ignore[method-assign]
    Generation.run = _timed(set_loop, loop)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Engine.decode, Sampler.sample = decode, sample  # type: ignore[method-assign]
        Generation.run = loop  # type: ignore[method-assign]


@dataclass(frozen=True)
class Run:
    """One measured request: its text, decode steps, their seconds and the split (seconds; None: unknown)."""

    text: str
    steps: int
    seconds: float
    cpu: float | None
    decode: float | None = None
    sample: float | None = None
    python_cpu: float | None = None  # the decoding thread's CPU seconds outside llama_decode and sampling


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_pid(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TurnstileDecode:
    name = "turnstile"

    def __init__(self, settings: w.Settings) -> None:
        self.sys = Turnstile(self.name, settings, None)

    def run(self, max_tokens: int) -> Run:
        rt = self.sys.rt
        CLOCK.reset()
        c0 = _cpu_self()
        r = self.sys._portal.call(lambda: rt.complete(MESSAGES, temperature=0.0, seed=w.SEED, max_tokens=max_tokens))
        cpu = _cpu_self() - c0
        t = r.timings
        first = t.first_token or 0.0
        window = t.cache + t.prefill + t.decode - first  # from the first token to the end of the run
        steps = r.usage.generated_tokens - 1
        decode, sample, python_cpu = CLOCK.split(steps)
        return Run(r.text, steps, window, cpu, decode, sample, python_cpu)

    def close(self) -> None:
        self.sys.close()


class EngineDecode:
    name = "engine loop"

    def __init__(self, settings: w.Settings) -> None:
        self.bare = Bare(self.name, settings)

    def run(self, max_tokens: int) -> Run:
        return self.bare._thread.submit(self._run, max_tokens).result()

    def _run(self, max_tokens: int) -> Run:
        eng = self.bare.eng
        prompt = eng.render(MESSAGES).tokens
        eng.seq_rm(-1, -1)
        for start in range(0, len(prompt), eng.n_batch):
            eng.decode(prompt[start : start + eng.n_batch], start)
        c0 = _cpu_self()
        t_dec = t_arg = c_calls = 0.0
        out: list[int] = []
        t0, tc0 = time.perf_counter(), time.thread_time()
        while True:
            a, ac = time.perf_counter(), time.thread_time()
            tok = eng.argmax()
            b, bc = time.perf_counter(), time.thread_time()
            t_arg += b - a
            c_calls += bc - ac
            out.append(tok)
            if eng.is_eog(tok) or len(out) >= max_tokens:
                break
            eng.decode([tok], len(prompt) + len(out) - 1)
            t_dec += time.perf_counter() - b
            c_calls += time.thread_time() - bc
        seconds = time.perf_counter() - t0
        python_cpu = time.thread_time() - tc0 - c_calls
        cpu = _cpu_self() - c0
        text = eng.detokenize(out[:-1] if eng.is_eog(out[-1]) else out)
        return Run(text, len(out) - 1, seconds, cpu, t_dec, t_arg, python_cpu)

    def close(self) -> None:
        self.bare.close()


class ServerDecode:
    name = "llama-server"

    def __init__(self, settings: w.Settings, binary: str) -> None:
        self.srv = Server(self.name, settings, binary, "none")

    def run(self, max_tokens: int) -> Run:
        srv = self.srv.srv
        assert srv._proc is not None
        pid = srv._proc.pid
        c0 = _cpu_pid(pid)
        r = srv.chat(MESSAGES, max_tokens=max_tokens, temperature=0.0, seed=w.SEED)
        cpu = _cpu_pid(pid) - c0
        return Run(r.text, r.predicted_n - 1, r.predicted_ms / 1000, cpu)

    def close(self) -> None:
        self.srv.close()


System = TurnstileDecode | EngineDecode | ServerDecode


@dataclass
class Tally:
    """One system at one thread count over the repetitions."""

    rates: list[float] = field(default_factory=list)  # steps/s per repetition
    steps: int = 0
    ms: dict[str, list[float]] = field(default_factory=dict)  # per-step split, per repetition
    texts: list[str] = field(default_factory=list)

    def add(self, runs: list[Run]) -> None:
        steps = sum(r.steps for r in runs)
        self.steps += steps
        secs = sum(r.seconds for r in runs)
        self.rates.append(steps / secs if secs > 0 else 0.0)
        per = {"total": secs}
        if all(r.cpu is not None for r in runs):
            per["cpu"] = sum(r.cpu or 0.0 for r in runs)
        if all(r.decode is not None for r in runs):
            per["llama_decode"] = sum(r.decode or 0.0 for r in runs)
            per["sample"] = sum(r.sample or 0.0 for r in runs)
            per["python"] = per["total"] - per["llama_decode"] - per["sample"]
            per["python_cpu"] = sum(r.python_cpu or 0.0 for r in runs)
        for k, v in per.items():
            self.ms.setdefault(k, []).append(1000 * v / max(1, steps))
        self.texts += [r.text for r in runs]


COLUMNS = [
    "threads",
    "system",
    "steps_s",
    "min",
    "max",
    "vs_server",
    "ms_step",
    "llama_decode_ms",
    "sample_ms",
    "python_ms",
    "python_cpu_ms",
    "cpu_ms",
    "steps",
    "same_text",
]


def _med(xs: list[float] | None, nd: int = 2) -> float | None:
    return round(statistics.median(xs), nd) if xs else None


def main(argv: list[str]) -> None:
    ap = _cli.parser("decode", __doc__)
    ap.add_argument("--reps", type=int, default=5, help="repetitions (systems alternate within each)")
    ap.add_argument("--runs", type=int, default=2, help="measured requests per system and repetition")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", default="2,1", help="comma-separated thread counts (one table block each)")
    ap.add_argument("--n-ctx", type=int, default=w.N_CTX)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=None, metavar="BIN")
    ap.add_argument("--systems", default="turnstile,engine,server", help="comma-separated: turnstile,engine,server")
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    _cli.check_binary(ap, args.llama_server)
    chosen = _cli.systems_arg(ap, args.systems, ("turnstile", "engine", "server"))
    model = Path(args.model) if args.model else default_model_path()
    threads = [int(t) for t in args.threads.split(",") if t]
    tallies: dict[tuple[int, str], Tally] = {}
    load: list[float] = []
    for th in threads:
        settings = w.Settings(model=model, n_ctx=args.n_ctx, threads=th)
        makers: list[tuple[str, Callable[[], System]]] = []
        if "turnstile" in chosen:
            makers.append(("turnstile", partial(TurnstileDecode, settings)))
        if "engine" in chosen:
            makers.append(("engine loop", partial(EngineDecode, settings)))
        if "server" in chosen and args.llama_server:
            makers.append(("llama-server", partial(ServerDecode, settings, args.llama_server)))
        for rep in range(args.reps):
            for sname, make in makers if rep % 2 == 0 else makers[::-1]:
                _cli.progress(f"{th} thread(s), rep {rep + 1}/{args.reps}: {sname}")
                load.append(os.getloadavg()[0])
                system = make()
                try:
                    system.run(args.max_tokens)  # the prompt is cached from here on
                    with timed_calls():
                        runs = [system.run(args.max_tokens) for _ in range(args.runs)]
                    tallies.setdefault((th, sname), Tally()).add(runs)
                finally:
                    system.close()
    rows: list[dict[str, Any]] = []
    for (th, sname), t in tallies.items():
        server = tallies.get((th, "llama-server"))
        ref = tallies.get((th, "turnstile")) or t
        med = statistics.median(t.rates)
        rows.append(
            {
                "threads": th,
                "system": sname,
                "steps_s": round(med, 1),
                "min": round(min(t.rates), 1),
                "max": round(max(t.rates), 1),
                "vs_server": round(med / statistics.median(server.rates), 3) if server else None,
                "ms_step": _med(t.ms.get("total")),
                "llama_decode_ms": _med(t.ms.get("llama_decode")),
                "sample_ms": _med(t.ms.get("sample"), 3),
                "python_ms": _med(t.ms.get("python"), 3),
                "python_cpu_ms": _med(t.ms.get("python_cpu"), 3),
                "cpu_ms": _med(t.ms.get("cpu")),
                "steps": t.steps,
                "same_text": f"{sum(a == b for a, b in zip(t.texts, ref.texts, strict=False))}/{len(ref.texts)}",
            }
        )
    params = {
        "model": model.name,
        "threads": threads,
        "reps": args.reps,
        "runs": args.runs,
        "max_tokens": args.max_tokens,
        "n_ctx": args.n_ctx,
        "n_batch": w.N_BATCH,
        "n_ubatch": w.N_UBATCH,
        "llama_server": args.llama_server,
        "load_average_1min": {"min": min(load, default=0.0), "max": max(load, default=0.0)},
    }
    _cli.write("decode", rows, params=params, out=args.out, columns=COLUMNS)
