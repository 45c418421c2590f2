"""The shared workload of the chat benchmarks: personas, the round-robin driver, and the systems it plays.

Every system answers the same schedule of turns (conversation c, turn t) with greedy decoding; each one
builds every conversation's history from its own replies. A system is anything with
`turn(conv, messages) -> Outcome` and `close()`:

- `TurnstileSystem`: a `Runtime` (driven from this thread through an anyio blocking portal);
- `LlamaCppSystem`: llama-cpp-python's `Llama.create_chat_completion`, with or without `LlamaRAMCache`;
- `ServerSystem`: llama-server `-np 1 --cache-ram MIB` through the `LlamaServer` harness.

"Ideal" prefill is measured on turnstile's own token lists: for each turn, the prompt tokens that no
earlier state of that conversation holds, `len(prompt) - lcp(prompt, that conversation's previous prompt
+ generated tokens)` (the slot's token list right after its previous turn).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from benchmarks._report import RESULTS_DIR, emit
from runtime.llama.models import default_model_path
from runtime.testing.llama_server import LlamaServer
from runtime.testing.workloads import PERSONAS, Messages, messages, persona, schedule, user_message

N_CTX = 4096
N_BATCH = 2048
N_UBATCH = 512
SEED = 0

__all__ = ["PERSONAS", "Messages", "messages", "persona", "schedule", "user_message"]


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n, lim = 0, min(len(a), len(b))
    while n < lim and a[n] == b[n]:
        n += 1
    return n


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


# --- what a system reports for one turn ----------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One turn as one system answered it."""

    text: str
    prompt_tokens: int
    prefilled: int
    generated: int
    ideal: int | None = None  # only turnstile can tell (its own token lists)


@dataclass(frozen=True)
class TurnRecord:
    conv: int
    turn: int
    outcome: Outcome
    seconds: float


class ChatSystem(Protocol):
    name: str

    def turn(self, conv: int, msgs: Messages) -> Outcome: ...

    def close(self) -> None: ...


@dataclass
class Conversations:
    """Each conversation's replies so far (the history a system builds from its own answers)."""

    replies: dict[tuple[int, int], str] = field(default_factory=dict)


def play(system: ChatSystem, turns: Sequence[tuple[int, int]], convs: Conversations) -> list[TurnRecord]:
    """Play the turns in order; every history comes from this system's own earlier replies."""
    out: list[TurnRecord] = []
    for c, t in turns:
        msgs = messages(c, t, convs.replies)
        t0 = time.perf_counter()
        o = system.turn(c, msgs)
        dt = time.perf_counter() - t0
        convs.replies[c, t] = o.text
        out.append(TurnRecord(c, t, o, dt))
    return out


# --- the systems ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What every system shares: the model, the context settings and the generation limits."""

    model: Path
    n_ctx: int = N_CTX
    threads: int = 2
    max_tokens: int = 48
    seed: int = SEED

    @property
    def sampling(self) -> dict[str, Any]:
        return {"temperature": 0.0, "seed": self.seed, "max_tokens": self.max_tokens}


class TurnstileSystem:
    """A turnstile Runtime, opened in a blocking portal so that the driver stays synchronous."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        cache_ram_mib: int | None = None,
        policy: str = "fifo",
    ) -> None:
        from anyio.from_thread import start_blocking_portal

        from runtime import Runtime

        self.name = name
        self.settings = settings
        self._stack = ExitStack()
        self._states: dict[int, list[int]] = {}  # each conversation's slot tokens after its last turn
        self._sessions: set[int] = set()
        t0 = time.perf_counter()
        try:
            self._portal = self._stack.enter_context(start_blocking_portal())
            self.rt = self._stack.enter_context(
                self._portal.wrap_async_context_manager(
                    Runtime.open(
                        settings.model,
                        data_dir=data_dir,
                        n_ctx=settings.n_ctx,
                        n_threads=settings.threads,
                        n_threads_batch=settings.threads,
                        n_batch=N_BATCH,
                        n_ubatch=N_UBATCH,
                        flash_attn=True,
                        cache_ram_mib=cache_ram_mib,
                        policy=policy,
                    )
                )
            )
        except BaseException:
            self._stack.close()
            raise
        self.open_seconds = time.perf_counter() - t0

    def remember(self, states: dict[int, list[int]]) -> None:
        """Carry the conversations' token lists over from an earlier runtime (a restart)."""
        self._states.update(states)

    @property
    def states(self) -> dict[int, list[int]]:
        return dict(self._states)

    def turn(self, conv: int, msgs: Messages) -> Outcome:
        sid = f"conv-{conv}"
        if conv not in self._sessions:
            known = self._portal.call(self.rt.list_sessions)
            if sid not in known:
                system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else None
                self._portal.call(lambda: self.rt.create_session(sid, system=system, **self.settings.sampling))
            self._sessions.add(conv)
        prompt = self.rt.backend.engine.render(msgs, spans=False).tokens  # the worker is idle between turns
        ideal = len(prompt) - lcp(prompt, self._states.get(conv, []))
        reply = self._portal.call(lambda: self.rt.chat(sid, msgs[-1]["content"]))
        if reply.usage.prompt_tokens != len(prompt):
            raise RuntimeError(
                f"{self.name}: the runtime's prompt ({reply.usage.prompt_tokens} tokens) is not the driver's "
                f"({len(prompt)}): the session's history differs from the workload's"
            )
        self._states[conv] = list(self.rt.backend.slot.tokens)
        u = reply.usage
        return Outcome(reply.text, u.prompt_tokens, u.prefilled_tokens, u.generated_tokens, ideal)

    def stats(self) -> dict[str, Any]:
        """The runtime's slot and disk counters (for the JSON)."""
        st = self.rt.stats()
        return {"slot": msgspec.to_builtins(st.slot), "disk": msgspec.to_builtins(st.disk)}

    def close(self) -> None:
        self._stack.close()


class LlamaCppSystem:
    """llama-cpp-python's `Llama.create_chat_completion`, optionally with a `LlamaRAMCache`.

    Prefilled tokens: the length of each completion's first `Llama.eval` call (the prompt suffix that
    prefix matching against the context, or a state loaded from the cache, did not cover); later calls
    evaluate one generated token each.
    """

    def __init__(self, name: str, settings: Settings, *, ram_cache_bytes: int | None = None) -> None:
        import llama_cpp
        from llama_cpp.llama_cache import LlamaRAMCache

        self.name = name
        self.settings = settings
        t0 = time.perf_counter()
        self.llm = llama_cpp.Llama(
            str(settings.model),
            n_ctx=settings.n_ctx,
            n_batch=N_BATCH,
            n_ubatch=N_UBATCH,
            n_threads=settings.threads,
            n_threads_batch=settings.threads,
            flash_attn=True,
            seed=settings.seed,
            verbose=False,
        )
        if ram_cache_bytes is not None:
            self.llm.set_cache(LlamaRAMCache(capacity_bytes=ram_cache_bytes))
        self.open_seconds = time.perf_counter() - t0
        self._evals: list[int] = []
        original = self.llm.eval

        def counting_eval(tokens: Sequence[int]) -> None:
            self._evals.append(len(tokens))
            original(tokens)

        self.llm.eval = counting_eval  # type: ignore[method-assign]

    def turn(self, conv: int, msgs: Messages) -> Outcome:
        self._evals.clear()
        res: Any = self.llm.create_chat_completion(
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=self.settings.max_tokens,
            temperature=0.0,
            seed=self.settings.seed,
        )
        usage = res["usage"]
        text = res["choices"][0]["message"]["content"] or ""
        prefilled = self._evals[0] if self._evals else 0
        return Outcome(text, int(usage["prompt_tokens"]), prefilled, int(usage["completion_tokens"]))

    def close(self) -> None:
        self.llm.close()


class ServerSystem:
    """llama-server `-np 1 --cache-ram MIB` on a loopback port (started here, stopped by close())."""

    def __init__(self, name: str, settings: Settings, binary: str | os.PathLike[str], *, cache_ram_mib: int) -> None:
        self.name = name
        self.settings = settings
        t0 = time.perf_counter()
        self.srv = LlamaServer(
            binary,
            settings.model,
            n_ctx=settings.n_ctx,
            threads=settings.threads,
            cache_ram_mib=cache_ram_mib,
            n_batch=N_BATCH,
            n_ubatch=N_UBATCH,
            seed=settings.seed,
        )
        self.srv.start()
        self.open_seconds = time.perf_counter() - t0

    def turn(self, conv: int, msgs: Messages) -> Outcome:
        r = self.srv.chat(msgs, max_tokens=self.settings.max_tokens, temperature=0.0, seed=self.settings.seed)
        return Outcome(r.text, r.prompt_tokens, r.prompt_n, r.predicted_n)

    def close(self) -> None:
        self.srv.stop()


Factory = Callable[[], ChatSystem]


def llama_cpp_factory(label: str, settings: Settings, ram_cache_bytes: int | None = None) -> Factory:
    return lambda: LlamaCppSystem(label, settings, ram_cache_bytes=ram_cache_bytes)


def server_factory(label: str, settings: Settings, binary: str, cache_ram_mib: int) -> Factory:
    return lambda: ServerSystem(label, settings, binary, cache_ram_mib=cache_ram_mib)


def turnstile_factory(
    label: str, settings: Settings, *, data_dir: str | None = None, cache_ram_mib: int | None = None
) -> Factory:
    return lambda: TurnstileSystem(label, settings, data_dir=data_dir, cache_ram_mib=cache_ram_mib)


@contextlib.contextmanager
def opened(factory: Factory) -> Iterator[ChatSystem]:
    system = factory()
    try:
        yield system
    finally:
        system.close()


# --- rows ----------------------------------------------------------------------------------------------

COLUMNS = [
    "system",
    "turns",
    "prompt_tokens",
    "prefilled",
    "ideal",
    "prefilled_per_ideal",
    "wall_s",
    "gen_tok_s",
    "wall_ratio",
    "same_text",
]


def ideal_of(records: Sequence[TurnRecord]) -> dict[tuple[int, int], int]:
    """Each turn's ideal prefill, from a turnstile run's records."""
    out: dict[tuple[int, int], int] = {}
    for r in records:
        if r.outcome.ideal is None:
            raise ValueError("ideal prefill is measured on a turnstile run")
        out[r.conv, r.turn] = r.outcome.ideal
    return out


def summarize(
    name: str,
    records: Sequence[TurnRecord],
    ideal: dict[tuple[int, int], int],
    reference: Sequence[TurnRecord] | None = None,
    first_wall: float | None = None,
) -> dict[str, Any]:
    """One table row: token totals, prefill against ideal, wall time, generation rate, text agreement."""
    prefilled = sum(r.outcome.prefilled for r in records)
    ideal_n = sum(ideal[r.conv, r.turn] for r in records)
    wall = sum(r.seconds for r in records)
    generated = sum(r.outcome.generated for r in records)
    row: dict[str, Any] = {
        "system": name,
        "turns": len(records),
        "prompt_tokens": sum(r.outcome.prompt_tokens for r in records),
        "prefilled": prefilled,
        "ideal": ideal_n,
        "prefilled_per_ideal": round(prefilled / ideal_n, 3) if ideal_n else 0.0,
        "wall_s": round(wall, 3),
        "gen_tok_s": round(generated / wall, 1) if wall else 0.0,
        "wall_ratio": round(wall / first_wall, 3) if first_wall else 1.0,
        "same_text": "-",
        "generated": generated,
    }
    if reference is not None:
        ref = {(r.conv, r.turn): r.outcome.text for r in reference}
        same = sum(ref.get((r.conv, r.turn)) == r.outcome.text for r in records)
        row["same_text"] = f"{same}/{len(records)}"
    return row


def per_turn(records: Sequence[TurnRecord]) -> list[dict[str, Any]]:
    """The records as JSON-friendly dicts (for the benchmark's JSON, not its table)."""
    return [
        {
            "conv": r.conv,
            "turn": r.turn,
            "prompt_tokens": r.outcome.prompt_tokens,
            "prefilled": r.outcome.prefilled,
            "generated": r.outcome.generated,
            "ideal": r.outcome.ideal,
            "seconds": round(r.seconds, 4),
        }
        for r in records
    ]


def compare_systems(systems: Sequence[tuple[str, Factory]], turns: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """Play the same turns on each system in turn; the first must be turnstile (it measures the ideal)."""
    rows: list[dict[str, Any]] = []
    ideal: dict[tuple[int, int], int] = {}
    reference: list[TurnRecord] = []
    first_wall: float | None = None
    for label, make in systems:
        progress(f"{label}: {len(turns)} turns")
        with opened(make) as system:
            records = play(system, turns, Conversations())
            stats = system.stats() if isinstance(system, TurnstileSystem) else None
        if not ideal:
            ideal, reference = ideal_of(records), records
        row = summarize(label, records, ideal, None if records is reference else reference, first_wall)
        first_wall = first_wall or row["wall_s"]
        if stats is not None:
            row["turnstile_stats"] = stats
        rows.append(row | {"per_turn": per_turn(records)})
    return rows


# --- command-line plumbing -------------------------------------------------------------------------------


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_common_args(ap: argparse.ArgumentParser, *, conversations: int, turns: int) -> None:
    ap.add_argument("--conversations", type=int, default=conversations, help="conversations played round robin")
    ap.add_argument("--turns", type=int, default=turns, help="turns per conversation")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens generated per turn at most (greedy)")
    ap.add_argument("--n-ctx", type=int, default=N_CTX)
    ap.add_argument("--threads", type=int, default=2, help="threads for every system (prefill and decode)")
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=None, metavar="BIN", help="a llama-server binary to compare with")
    ap.add_argument("--out", default=None, metavar="DIR", help=f"where to write NAME.json (default: {RESULTS_DIR})")


def settings_from(args: argparse.Namespace) -> Settings:
    model = Path(args.model) if args.model else default_model_path()
    return Settings(model=model, n_ctx=args.n_ctx, threads=args.threads, max_tokens=args.max_tokens, seed=SEED)


def common_params(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """The run's settings, for the JSON's params."""
    return {
        "model": settings.model.name,
        "conversations": args.conversations,
        "turns": args.turns,
        "max_tokens": settings.max_tokens,
        "n_ctx": settings.n_ctx,
        "threads": settings.threads,
        "n_batch": N_BATCH,
        "n_ubatch": N_UBATCH,
        "flash_attn": True,
        "seed": settings.seed,
        "llama_server": args.llama_server,
    }


def systems_arg(ap: argparse.ArgumentParser, value: str, allowed: Sequence[str]) -> list[str]:
    """The comma-separated `--systems` value, each one checked against `allowed`."""
    names = [s for s in value.split(",") if s]
    bad = [s for s in names if s not in allowed]
    if bad or not names:
        ap.error(f"unknown systems {bad}; choose from {', '.join(allowed)}")
    return names


def check_binary(ap: argparse.ArgumentParser, binary: str | None) -> None:
    if binary and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        ap.error(f"--llama-server {binary!r} is not an executable file")


def out_path(out: str | None, name: str) -> Path | None:
    return Path(out) / f"{name}.json" if out else None


def write(
    name: str,
    rows: Sequence[dict[str, Any]],
    *,
    params: dict[str, Any],
    out: str | None,
    columns: Sequence[str] | None = None,
) -> Path:
    return emit(name, rows, params=params, columns=columns, out=out_path(out, name))


def temp_dir(prefix: str) -> AbstractContextManager[str]:
    return tempfile.TemporaryDirectory(prefix=prefix)


def progress(msg: str) -> None:
    print(f"  .. {msg}", flush=True)
