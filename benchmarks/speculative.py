"""`python -m benchmarks speculative`: decode speed with draft-less n-gram speculation, where replies copy.

Workloads (greedy, SmolLM2 by default, 2 threads, n_batch 2048, n_ubatch 512, flash attention):

- copy: one conversation asks for a 120-word passage back, word for word; the prompt is cached (a warm-up
  request first), then the same request is measured `--copy-runs` times;
- agent: 6 conversations interleaved round robin for `--agent-turns` turns; each turn either quotes back a
  tool result (a JSON record) or rewrites a 40-line snippet with one change; histories are each system's
  own replies;
- chat: the interleaved benchmark's ordinary chat (`tests.support.workloads`, 6 x `--chat-turns`), where
  little is copied: speculation must cost nothing there (turnstile only).

Systems: turnstile without and with `speculative="ngram"`, and with `--llama-server BIN` llama-server
`-np 1` with `--spec-type none` and `ngram-map-k`; on the copy workload also `engine loop`, the bare minimum
(`runtime.llama.Engine` alone: prefill, then `decode` one token + `argmax` on the logits until EOS or the
limit, no slot, no sampler, no detokenization), to show what turnstile's per-token path costs over it.
Every repetition runs each workload on every system in turn (systems alternate, all kept open), and the table
gives decode tokens/s over the same window for every system: the tokens after the first, over the time from the
first token to the last (llama-server's `predicted_ms`, which covers n-1 of its `predicted_n` tokens; turnstile's
run from `timings.first_token` to its end; the engine loop's from its first argmax), as the median and the
range over the repetitions, drafted and accepted tokens, and how many replies equal turnstile's without
speculation.
It also times rebuilding a conversation's n-gram index from its tokens (what a swap costs).

    python -m benchmarks speculative [--reps 3] [--copy-runs 2] [--agent-turns 2] [--chat-turns 3]
                                     [--threads 2] [--llama-server BIN] [--no-bare] [--workloads copy,agent,chat]
                                     [--out DIR]
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _cli
from benchmarks import _workload as w
from runtime.llama.models import default_model_path
from runtime.slot.ngram import NgramIndex
from tests.support import workloads
from tests.support.llama_server import LlamaServer
from tests.support.workloads import Messages

PASSAGE = (
    "The old lighthouse stood at the edge of the northern cliffs, where the wind came in hard from the sea and "
    "the grass grew short and grey. For a hundred years its keepers had climbed the spiral stairs each evening "
    "to light the lamp, and each morning they had climbed them again to put it out. The last keeper was a quiet "
    "man named Thomas, who kept a garden of herbs behind the tower and wrote long letters to his sister in the "
    "city. When the lamp was finally replaced by an automatic light, Thomas stayed on, because he could not "
    "imagine living anywhere else, and the villagers said that on stormy nights you could still see him."
)
COPY_SYSTEM = "You are a helpful assistant."
COPY_USER = f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}"


def tool_result(conv: int, turn: int) -> str:
    """A tool's JSON record (different per conversation and turn)."""
    rec = {
        "order_id": f"A-{1000 + 37 * conv + turn}",
        "customer": [
            "Ada Lovelace",
            "Alan Turing",
            "Grace Hopper",
            "Edsger Dijkstra",
            "Barbara Liskov",
            "Ken Thompson",
        ][conv % 6],
        "items": [{"sku": f"SKU-{conv}{turn}{i}", "qty": i + 1, "price": round(4.5 + 1.25 * i, 2)} for i in range(3)],
        "status": "shipped" if turn % 2 else "processing",
        "address": {"street": f"{12 + conv} Harbour Road", "city": "Portsmouth", "zip": f"PO{conv} {turn}QX"},
    }
    return json.dumps(rec, indent=2)


def snippet(conv: int) -> str:
    """A 40-line Python snippet (names differ per conversation)."""
    name = ["orders", "users", "events", "items", "rows", "jobs"][conv % 6]
    lines = [f"def summarize_{name}({name}):", f'    """Summarize a list of {name}."""', "    total = 0"]
    lines += ["    count = 0", "    largest = None", "    smallest = None", f"    for entry in {name}:"]
    body = [
        "        value = entry.get('value', 0)",
        "        if value is None:",
        "            continue",
        "        total += value",
        "        count += 1",
        "        if largest is None or value > largest:",
        "            largest = value",
        "        if smallest is None or value < smallest:",
        "            smallest = value",
    ]
    lines += body
    lines += ["    if count == 0:", "        return {'count': 0, 'total': 0, 'mean': None}", "    mean = total / count"]
    lines += ["    return {", "        'count': count,", "        'total': total,", "        'mean': mean,"]
    lines += ["        'largest': largest,", "        'smallest': smallest,", "    }", "", ""]
    lines += [
        f"def print_{name}({name}):",
        f"    summary = summarize_{name}({name})",
        "    for key in sorted(summary):",
    ]
    lines += ["        print(key, summary[key])", "", "", "def main():", f"    {name} = ["]
    lines += [f"        {{'value': {3 * i + conv}}}," for i in range(5)]
    lines += ["    ]", f"    print_{name}({name})"]
    return "\n".join(lines[:40])


def agent_user(conv: int, turn: int) -> str:
    if (conv + turn) % 2 == 0:
        return f"The tool returned:\n\n{tool_result(conv, turn)}\n\nQuote the tool result back exactly."
    return f"Rewrite this code with the variable `total` renamed to `acc`. Output only the code.\n\n{snippet(conv)}"


def agent_messages(conv: int, turn: int, replies: dict[tuple[int, int], str]) -> Messages:
    msgs: Messages = [{"role": "system", "content": f"You are agent {conv}, a precise assistant."}]
    for t in range(turn):
        msgs += [{"role": "user", "content": agent_user(conv, t)}, {"role": "assistant", "content": replies[conv, t]}]
    return [*msgs, {"role": "user", "content": agent_user(conv, turn)}]


NOTES = [
    "The bakery on Mill Street opens at seven. Its rye loaf sells out by nine, so come early if you want one.",
    "Saturn's rings are mostly ice and rock. They are wide but very thin, often less than a kilometre thick.",
    "A list comprehension builds a list in one expression. It is often faster than a loop that appends.",
    "The night train to Vienna leaves at ten. Book a couchette, because the seats are hard and the trip is long.",
    "Tomatoes need six hours of sun a day. Water them at the base in the morning, never on the leaves.",
    "The Great Pyramid was built for Khufu. It was the tallest building in the world for almost four thousand years.",
]


def quotes_user(conv: int, turn: int, replies: dict[tuple[int, int], str]) -> str:
    """Ordinary chat that quotes: a friend's note first, then the assistant's own previous answer, each to be
    quoted back before the next question is answered."""
    question = workloads.persona(conv)[1][turn % 5]
    if turn == 0:
        return (
            f'A friend sent me this note:\n\n"{NOTES[conv % 6]}"\n\nQuote the note back first, then answer: {question}'
        )
    said = replies[conv, turn - 1]
    return f'Earlier you said:\n\n"{said}"\n\nQuote what you said back first, then answer: {question}'


def quotes_messages(conv: int, turn: int, replies: dict[tuple[int, int], str]) -> Messages:
    system, _ = workloads.persona(conv)
    msgs: Messages = [{"role": "system", "content": system}]
    for t in range(turn):
        msgs += [
            {"role": "user", "content": quotes_user(conv, t, replies)},
            {"role": "assistant", "content": replies[conv, t]},
        ]
    return [*msgs, {"role": "user", "content": quotes_user(conv, turn, replies)}]


# --- systems ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    text: str
    generated: int
    decode_s: float
    draft_n: int
    draft_n_accepted: int

    @property
    def timed(self) -> int:
        """Tokens in the timed window `decode_s`: every one after the first (which comes from the prompt's logits)."""
        return max(0, self.generated - 1)


class Turnstile:
    """A Runtime (stateless `complete` calls: the driver keeps the histories, as for llama-server)."""

    def __init__(self, name: str, settings: w.Settings, speculative: str | None) -> None:
        from contextlib import ExitStack

        from anyio.from_thread import start_blocking_portal

        from runtime import Runtime

        self.name = name
        self._stack = ExitStack()
        self._portal = self._stack.enter_context(start_blocking_portal())
        self.rt = self._stack.enter_context(
            self._portal.wrap_async_context_manager(
                Runtime.open(
                    settings.model,
                    n_ctx=settings.n_ctx,
                    n_threads=settings.threads,
                    n_threads_batch=settings.threads,
                    n_batch=w.N_BATCH,
                    n_ubatch=w.N_UBATCH,
                    flash_attn=True,
                    speculative=speculative,  # type: ignore[arg-type]
                )
            )
        )

    def turn(self, msgs: Messages, max_tokens: int) -> Turn:
        r = self._portal.call(lambda: self.rt.complete(msgs, temperature=0.0, seed=w.SEED, max_tokens=max_tokens))
        u, t = r.usage, r.timings
        after_first = t.cache + t.prefill + t.decode - (t.first_token or 0.0)  # llama-server's predicted_ms window
        return Turn(r.text, u.generated_tokens, after_first, u.draft_n, u.draft_n_accepted)

    def close(self) -> None:
        self._stack.close()


class Server:
    """llama-server `-np 1` with a speculative type."""

    def __init__(self, name: str, settings: w.Settings, binary: str, spec_type: str) -> None:
        self.name = name
        self.srv = LlamaServer(
            binary,
            settings.model,
            n_ctx=settings.n_ctx,
            threads=settings.threads,
            cache_ram_mib=8192,
            n_batch=w.N_BATCH,
            n_ubatch=w.N_UBATCH,
            seed=w.SEED,
            extra_args=["--spec-type", spec_type],
        )
        self.srv.start()

    def turn(self, msgs: Messages, max_tokens: int) -> Turn:
        r = self.srv.chat(msgs, max_tokens=max_tokens, temperature=0.0, seed=w.SEED)
        t = r.raw.get("timings", {})
        return Turn(
            r.text, r.predicted_n, r.predicted_ms / 1000, int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))
        )

    def close(self) -> None:
        self.srv.stop()


class Bare:
    """The bare minimum: the engine alone, greedy by argmax, timed from the first token like turnstile."""

    def __init__(self, name: str, settings: w.Settings) -> None:
        from runtime.config import EngineConfig
        from runtime.llama.engine import Engine

        self.name = name
        cfg = EngineConfig(
            n_ctx=settings.n_ctx,
            n_batch=w.N_BATCH,
            n_ubatch=w.N_UBATCH,
            n_threads=settings.threads,
            n_threads_batch=settings.threads,
            flash_attn=True,
        )
        # its own thread, ended on close (like a Runtime's slot thread): the OpenMP team goes with it
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bare-engine")
        self.eng = self._thread.submit(Engine, settings.model, cfg).result()

    def turn(self, msgs: Messages, max_tokens: int) -> Turn:
        return self._thread.submit(self._turn, msgs, max_tokens).result()

    def _turn(self, msgs: Messages, max_tokens: int) -> Turn:
        eng = self.eng
        prompt = eng.render(msgs).tokens
        eng.seq_rm(-1, -1)
        for start in range(0, len(prompt), eng.n_batch):
            eng.decode(prompt[start : start + eng.n_batch], start)
        t0 = time.perf_counter()
        out: list[int] = []
        while True:
            tok = eng.argmax()
            out.append(tok)
            if eng.is_eog(tok) or len(out) >= max_tokens:
                break
            eng.decode([tok], len(prompt) + len(out) - 1)
        dt = time.perf_counter() - t0
        text = eng.detokenize(out[:-1] if eng.is_eog(out[-1]) else out)
        return Turn(text, len(out), dt, 0, 0)

    def close(self) -> None:
        self._thread.submit(self.eng.close).result()
        self._thread.shutdown()


System = Turnstile | Server | Bare


# --- workloads -------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """One workload on one system over the repetitions."""

    rates: list[float] = field(default_factory=list)
    generated: int = 0
    draft_n: int = 0
    accepted: int = 0
    texts: list[str] = field(default_factory=list)  # the first repetition's replies

    def add(self, turns: list[Turn], first: bool) -> None:
        timed, dec = sum(t.timed for t in turns), sum(t.decode_s for t in turns)
        self.rates.append(timed / dec if dec > 0 else 0.0)
        gen = sum(t.generated for t in turns)
        self.generated += gen
        self.draft_n += sum(t.draft_n for t in turns)
        self.accepted += sum(t.draft_n_accepted for t in turns)
        if first:
            self.texts = [t.text for t in turns]


def run_copy(system: System, runs: int) -> list[Turn]:
    msgs = [{"role": "system", "content": COPY_SYSTEM}, {"role": "user", "content": COPY_USER}]
    system.turn(msgs, 200)  # the prompt is cached from here on
    return [system.turn(msgs, 200) for _ in range(runs)]


def run_agent(system: System, turns: int, max_tokens: int = 128) -> list[Turn]:
    replies: dict[tuple[int, int], str] = {}
    out = []
    for c, t in workloads.schedule(6, turns):
        r = system.turn(agent_messages(c, t, replies), max_tokens)
        replies[c, t] = r.text
        out.append(r)
    return out


def run_quotes(system: System, turns: int, max_tokens: int = 96) -> list[Turn]:
    replies: dict[tuple[int, int], str] = {}
    out = []
    for c, t in workloads.schedule(6, turns):
        r = system.turn(quotes_messages(c, t, replies), max_tokens)
        replies[c, t] = r.text
        out.append(r)
    return out


def run_chat(system: System, turns: int, max_tokens: int = 48) -> list[Turn]:
    replies: dict[tuple[int, int], str] = {}
    out = []
    for c, t in workloads.schedule(6, turns):
        r = system.turn(workloads.messages(c, t, replies), max_tokens)
        replies[c, t] = r.text
        out.append(r)
    return out


def rebuild_ms(n_tokens: int, repeat: int = 5) -> float:
    """Milliseconds to index `n_tokens` tokens from scratch (best of `repeat`)."""
    tokens = [(i * 7919) % 49152 for i in range(n_tokens)]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        NgramIndex().sync(tokens)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


COLUMNS = [
    "workload",
    "system",
    "decode_tok_s",
    "min",
    "max",
    "vs_off",
    "generated",
    "draft_n",
    "accepted",
    "same_text",
]


def main(argv: list[str]) -> None:
    ap = _cli.parser("speculative", __doc__)
    ap.add_argument("--reps", type=int, default=3, help="repetitions (systems alternate within each)")
    ap.add_argument("--copy-runs", type=int, default=2, help="measured copy requests per repetition")
    ap.add_argument("--agent-turns", type=int, default=2, help="turns per agent conversation")
    ap.add_argument("--quotes-turns", type=int, default=2, help="turns per chat-with-quotes conversation")
    ap.add_argument("--chat-turns", type=int, default=3, help="turns per ordinary-chat conversation")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=w.N_CTX)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=None, metavar="BIN", help="compare with llama-server's ngram-map-k")
    ap.add_argument("--workloads", default="copy,agent,quotes,chat", help="which workloads, comma-separated")
    ap.add_argument("--no-bare", action="store_true", help="leave out the bare engine loop (copy workload)")
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    _cli.check_binary(ap, args.llama_server)
    model = Path(args.model) if args.model else default_model_path()
    settings = w.Settings(model=model, n_ctx=args.n_ctx, threads=args.threads)
    makers: list[tuple[str, type, Callable[[], System]]] = [
        ("turnstile", Turnstile, lambda: Turnstile("turnstile", settings, None)),
        ("turnstile ngram", Turnstile, lambda: Turnstile("turnstile ngram", settings, "ngram")),
    ]
    if not args.no_bare:
        makers.append(("engine loop", Bare, lambda: Bare("engine loop", settings)))
    if args.llama_server:
        binary = args.llama_server
        makers += [
            ("llama-server none", Server, lambda: Server("llama-server none", settings, binary, "none")),
            (
                "llama-server ngram-map-k",
                Server,
                lambda: Server("llama-server ngram-map-k", settings, binary, "ngram-map-k"),
            ),
        ]
    # which systems play each workload: the bare loop only the copy one, ordinary chat only turnstile
    workloads: list[tuple[str, Callable[[System], list[Turn]], tuple[type, ...]]] = [
        ("copy", lambda s: run_copy(s, args.copy_runs), (Turnstile, Server, Bare)),
        ("agent", lambda s: run_agent(s, args.agent_turns), (Turnstile, Server)),
        ("quotes", lambda s: run_quotes(s, args.quotes_turns), (Turnstile, Server)),
        ("chat", lambda s: run_chat(s, args.chat_turns), (Turnstile,)),
    ]
    chosen = [x for x in args.workloads.split(",") if x]
    if unknown := set(chosen) - {name for name, _, _ in workloads}:
        ap.error(f"--workloads: unknown {sorted(unknown)} (copy, agent, quotes, chat)")
    workloads = [wl for wl in workloads if wl[0] in chosen]
    tallies: dict[tuple[str, str], Tally] = {}
    # Each system is opened for its play and closed after it, so only one llama.cpp context decodes in this
    # process at a time: every thread that ever decoded keeps an OpenMP team, and with more of them alive than
    # cores libgomp stops spinning between graphs (runtime/loop/slot_thread.py), which would slow them all.
    for rep in range(args.reps):
        for wname, play, kinds in workloads:
            order = makers if rep % 2 == 0 else makers[::-1]
            for sname, kind, make in order:
                if not issubclass(kind, kinds):
                    continue
                _cli.progress(f"rep {rep + 1}/{args.reps} {wname} on {sname}")
                sys_ = make()
                try:
                    tallies.setdefault((wname, sname), Tally()).add(play(sys_), rep == 0)
                finally:
                    sys_.close()
    rows: list[dict[str, Any]] = []
    for (wname, sname), t in tallies.items():
        base = tallies[wname, "turnstile"]
        med = statistics.median(t.rates)
        rows.append(
            {
                "workload": wname,
                "system": sname,
                "decode_tok_s": round(med, 1),
                "min": round(min(t.rates), 1),
                "max": round(max(t.rates), 1),
                "vs_off": round(med / statistics.median(base.rates), 3),
                "generated": t.generated,
                "draft_n": t.draft_n,
                "accepted": t.accepted,
                "same_text": f"{sum(a == b for a, b in zip(t.texts, base.texts, strict=True))}/{len(base.texts)}",
            }
        )
    rebuild = {n: round(rebuild_ms(n), 2) for n in (1024, 4096, 16384)}
    print("  n-gram index rebuild from tokens (ms): " + ", ".join(f"{n:,} tokens {ms}" for n, ms in rebuild.items()))
    params = {
        "model": model.name,
        "threads": args.threads,
        "n_ctx": args.n_ctx,
        "n_batch": w.N_BATCH,
        "n_ubatch": w.N_UBATCH,
        "reps": args.reps,
        "copy_runs": args.copy_runs,
        "agent_turns": args.agent_turns,
        "quotes_turns": args.quotes_turns,
        "chat_turns": args.chat_turns,
        "llama_server": args.llama_server,
        "index_rebuild_ms": rebuild,
    }
    _cli.write("speculative", rows, params=params, out=args.out, columns=COLUMNS)
