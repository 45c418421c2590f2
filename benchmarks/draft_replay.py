"""`python -m benchmarks draft-replay`: n-gram speculation judged without a clock, by replaying the drafter.

Plays the speculative benchmark's workloads (copy, agent, quotes, chat) on turnstile without speculation,
records every request's prompt tokens and generated tokens (greedy), then replays the drafter
(`runtime.slot.ngram`: pure Python) over each stream as the decode loop would run it: at each step a draft,
accepted as far as it equals what was generated; the index follows the tokens across the interleaved
conversations as the slot's does. For the same greedy text the drafted, accepted and step counts are exact;
each step is priced 1 plus `--cost` per drafted token (a drafted token's extra batch cost in one-token steps:
0.44 for SmolLM2 on 2 CPU threads, `benchmarks/RESULTS.md`), which gives a modelled speed-up over plain
decoding that load does not disturb. (Speculation can change the text where a batch's different kernel shapes
flip a near-tie; the wall-clock `speculative` benchmark shows that.)

    python -m benchmarks draft-replay [--workloads copy,agent,quotes,chat] [--cost 0.44] [--threads 1] [--out DIR]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import _cli
from benchmarks import _workload as w
from benchmarks import speculative as sp
from runtime.llama.models import default_model_path
from runtime.slot.ngram import Drafter, NgramIndex


@dataclass(frozen=True)
class Stream:
    prompt: list[int]
    generated: list[int]


def record(settings: w.Settings, plays: list[tuple[str, Callable[[sp.System], Any]]]) -> dict[str, list[Stream]]:
    """Each workload's requests as (prompt, generated) token lists, turnstile without speculation."""
    from runtime.slot import executor

    loop = executor.generate  # type: ignore[attr-defined]
    streams: list[Stream] = []

    def recording(eng: Any, tokens: list[int], req: Any, generated: list[int], *a: Any, **k: Any) -> Any:
        prompt = list(tokens)
        out = loop(eng, tokens, req, generated, *a, **k)
        streams.append(Stream(prompt, list(generated)))
        return out

    out: dict[str, list[Stream]] = {}
    setattr(executor, "generate", recording)  # noqa: B010 - the name the executor calls
    system = sp.Turnstile("turnstile", settings, None)
    try:
        for name, play in plays:
            _cli.progress(f"recording {name}")
            streams.clear()
            play(system)
            out[name] = list(streams)
    finally:
        system.close()
        setattr(executor, "generate", loop)  # noqa: B010
    return out


@dataclass
class Replay:
    tokens: int = 0  # tokens after each request's first (the timed window's)
    steps: int = 0
    drafted: int = 0
    accepted: int = 0


def replay(streams: list[Stream], ends: Callable[[int], bool]) -> Replay:
    """The decode loop's steps over recorded streams, with the drafter (one index, synced per request)."""
    index = NgramIndex()
    r = Replay()
    for s in streams:
        index.sync(s.prompt)
        g, n = s.generated, len(s.generated)
        drafter = Drafter(index, ends=ends)
        i = 0
        while i < n - 1:
            tok = g[i]
            draft = drafter.draft(tok, n)
            index.append(tok)
            a = 0
            while a < len(draft) and i + 1 + a < n and draft[a] == g[i + 1 + a]:
                a += 1
            if draft:
                drafter.accepted_n(len(draft), a)
            for t in g[i + 1 : i + 1 + a]:
                index.append(t)
            r.steps += 1
            i += 1 + a
        r.tokens += max(0, n - 1)
        r.drafted += drafter.drafted
        r.accepted += drafter.accepted
    return r


COLUMNS = ["workload", "requests", "tokens", "steps", "drafted", "accepted", "modelled_speedup"]


def main(argv: list[str]) -> None:
    ap = _cli.parser("draft-replay", __doc__)
    ap.add_argument("--workloads", default="copy,agent,quotes,chat")
    ap.add_argument("--cost", type=float, default=0.44, help="a drafted token's extra cost, in one-token steps")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--agent-turns", type=int, default=2)
    ap.add_argument("--quotes-turns", type=int, default=2)
    ap.add_argument("--chat-turns", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    model = Path(args.model) if args.model else default_model_path()
    settings = w.Settings(model=model, threads=args.threads)
    known: dict[str, Callable[[sp.System], Any]] = {
        "copy": lambda s: sp.run_copy(s, 1),
        "agent": lambda s: sp.run_agent(s, args.agent_turns),
        "quotes": lambda s: sp.run_quotes(s, args.quotes_turns),
        "chat": lambda s: sp.run_chat(s, args.chat_turns),
    }
    chosen = _cli.systems_arg(ap, args.workloads, tuple(known))
    recorded = record(settings, [(name, known[name]) for name in chosen])
    from runtime.config import EngineConfig
    from runtime.llama.engine import Engine

    with Engine(model, EngineConfig(n_ctx=256, n_threads=1)) as eng:
        eog_ids = frozenset(eng.eog_tokens())
    rows: list[dict[str, Any]] = []
    for name, streams in recorded.items():
        r = replay(streams, eog_ids.__contains__)
        cost = r.steps + args.cost * r.drafted
        rows.append(
            {
                "workload": name,
                "requests": len(streams),
                "tokens": r.tokens,
                "steps": r.steps,
                "drafted": r.drafted,
                "accepted": r.accepted,
                "modelled_speedup": round(r.tokens / cost, 3) if cost else None,
            }
        )
    params = {"model": model.name, "threads": args.threads, "cost": args.cost, "workloads": chosen}
    _cli.write("draft-replay", rows, params=params, out=args.out, columns=COLUMNS)
