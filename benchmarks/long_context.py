"""`python -m benchmarks long-context`: 8 long conversations round robin, a RAM cache that holds about 3.

Each conversation starts with its own long document (~6,000 tokens of generated prose, nothing shared
between conversations) and a question, then asks short follow-ups; `--rounds` rounds, conversation 0..7
in each, greedy, `--max-tokens` tokens per reply. SmolLM2-135M keeps 22.5 KiB of K and V per token, so a
conversation's state is ~140 MB and a `--cache-ram` of 450 MiB holds three: with the slot's own
conversation, four of eight, so a plain RAM cache played round robin always misses. Systems (the same
n_ctx 8192, threads, n_batch 2048, n_ubatch 512, flash attention):

- turnstile, RAM cache `--cache-ram` MiB, no disk tier;
- turnstile, the same RAM cache + disk tier (data_dir in a temporary directory, `--dir`);
- llama-server `-np 1 --cache-ram` MiB (when `--llama-server BIN` is given).

Columns: prompt tokens, tokens prefilled, the fewest any system could prefill ("ideal": each turn's new
tokens, measured on turnstile's token lists), wall time, the ratios to llama-server, and for turnstile
the swap work: seconds spent in the cache update (save, evictions and spills to disk, finding and
loading a state), bytes moved (saved + restored) and their rate. `same_text` counts replies equal to the
first system's.

    python -m benchmarks long-context [--conversations 8] [--rounds 3] [--doc-tokens 5800] [--max-tokens 16]
                                      [--cache-ram 450] [--llama-server BIN] [--systems turnstile,turnstile-disk,server]
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import _cli, _rows, _systems
from benchmarks import _workload as w
from caches.tiered import Swap
from tests.support import workloads

SYSTEMS = ("turnstile", "turnstile-disk", "server")
_PROSE = (
    "the harbour council reviewed annual budget lighthouse keeper ferry schedule storm damage fishing fleet "
    "repairs tide tables winter supplies school library bridge road railway station market square museum "
    "garden orchard river valley mountain pass village mayor report committee decided approved rejected "
    "measured counted estimated recorded delivered ordered because after before during while although "
    "north south east west morning evening ships boats nets engines sails ropes crates barrels grain salt"
)
WORDS = tuple(_PROSE.split())
QUESTIONS = [
    "Summarise the first paragraph of this report in one sentence.",
    "Which place is mentioned most often?",
    "What did the committee decide?",
    "Name one number from the report.",
    "Was anything rejected?",
    "Give the report a short title.",
]
COLUMNS = [
    "system",
    "turns",
    "prompt_tokens",
    "prefilled",
    "ideal",
    "prefill_vs_server",
    "wall_s",
    "wall_vs_server",
    "swap_s",
    "swap_GB",
    "swap_GB_s",
    "disk_loads",
    "same_text",
]


def document(conv: int, n_tokens: int, count: Callable[[str], int]) -> str:
    """Generated prose of about `n_tokens` tokens (at most), different for every conversation."""
    rng = random.Random(1000 + conv)
    sentences: list[str] = []
    while True:
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        sentences.append(
            f"In section {len(sentences) + 1} of report {conv}, " + " ".join(words) + f" {rng.randint(1, 999)}."
        )
        if len(sentences) % 20 == 0 and count(" ".join(sentences)) >= n_tokens:
            break
    while count(" ".join(sentences)) > n_tokens:
        sentences.pop()
    return " ".join(sentences)


def messages(docs: list[str], conv: int, rnd: int, replies: dict[tuple[int, int], str]) -> workloads.Messages:
    """Conversation `conv` at round `rnd`: the document and first question, then short follow-ups."""
    msgs: workloads.Messages = []
    for r in range(rnd + 1):
        q = QUESTIONS[(conv + r) % len(QUESTIONS)]
        msgs.append({"role": "user", "content": f"{docs[conv]}\n\n{q}" if r == 0 else q})
        if r < rnd:
            msgs.append({"role": "assistant", "content": replies[conv, r]})
    return msgs


@dataclass
class SwapMeter:
    """Times every cache update of a turnstile runtime's slot and adds up the bytes it moved."""

    seconds: float = 0.0
    moved: int = 0

    def wrap(self, system: _systems.TurnstileSystem) -> None:
        cache = system.rt.backend.slot.cache  # type: ignore[attr-defined]
        update: Callable[..., Swap] = cache.update

        def timed(*args: Any, **kwargs: Any) -> Swap:
            t0 = time.perf_counter()
            swap = update(*args, **kwargs)
            self.seconds += time.perf_counter() - t0
            self.moved += swap.saved + swap.restored
            return swap

        cache.update = timed


def play(
    system: w.ChatSystem, docs: list[str], conversations: int, rounds: int
) -> tuple[list[w.TurnRecord], dict[tuple[int, int], str]]:
    replies: dict[tuple[int, int], str] = {}
    out: list[w.TurnRecord] = []
    for rnd in range(rounds):
        for c in range(conversations):
            msgs = messages(docs, c, rnd, replies)
            t0 = time.perf_counter()
            o = system.turn(c, msgs)
            out.append(w.TurnRecord(c, rnd, o, time.perf_counter() - t0))
            replies[c, rnd] = o.text
    return out, replies


def main(argv: list[str]) -> None:
    ap = _cli.parser("long-context", __doc__)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="turns per conversation, played round robin")
    ap.add_argument("--doc-tokens", type=int, default=5800, help="tokens of each conversation's document")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens generated per turn at most (greedy)")
    ap.add_argument("--cache-ram", type=int, default=450, help="RAM prompt cache of every system (MiB)")
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--llama-server", default=None, metavar="BIN", help="a llama-server binary to compare with")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}")
    ap.add_argument("--dir", default=None, help="where the disk tier's temporary directory goes")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write long-context.json")
    args = ap.parse_args(argv)
    _cli.check_binary(ap, args.llama_server)
    names = _cli.systems_arg(ap, args.systems, SYSTEMS)
    if not names[0].startswith("turnstile"):  # ideal prefill is measured on turnstile's token lists
        names = ["turnstile", *names]
    args.turns = args.rounds
    settings = _cli.settings_from(args)
    mib = args.cache_ram

    import llama_cpp

    vocab = llama_cpp.Llama(str(settings.model), vocab_only=True, verbose=False)
    docs = [
        document(c, args.doc_tokens, lambda s: len(vocab.tokenize(s.encode(), add_bos=False)))
        for c in range(args.conversations)
    ]
    vocab.close()

    rows: list[dict[str, Any]] = []
    ideal: dict[tuple[int, int], int] = {}
    reference: list[w.TurnRecord] | None = None
    with tempfile.TemporaryDirectory(prefix="turnstile-long-context-", dir=args.dir) as tmp:
        for n in names:
            meter: SwapMeter | None = None
            make: w.Factory
            if n == "turnstile":
                label = f"turnstile, RAM {mib} MiB"
                make = _systems.turnstile_factory(label, settings, cache_ram_mib=mib)
            elif n == "turnstile-disk":
                label = f"turnstile, RAM {mib} MiB + disk"
                make = _systems.turnstile_factory(label, settings, cache_ram_mib=mib, data_dir=str(Path(tmp) / "data"))
            elif args.llama_server:
                label = f"llama-server -np 1 --cache-ram {mib}"
                make = _systems.server_factory(label, settings, args.llama_server, mib)
            else:
                continue
            _cli.progress(f"{label}: {args.conversations} conversations x {args.rounds} rounds")
            with w.opened(make) as system:
                stats: dict[str, Any] | None = None
                if isinstance(system, _systems.TurnstileSystem):
                    meter = SwapMeter()
                    meter.wrap(system)
                records, _ = play(system, docs, args.conversations, args.rounds)
                if isinstance(system, _systems.TurnstileSystem):
                    stats = system.stats()
            if not ideal:
                ideal, reference = _rows.ideal_of(records), records
            row = _rows.summarize(label, records, ideal, None if records is reference else reference)
            if meter is not None:
                row |= {
                    "swap_s": round(meter.seconds, 3),
                    "swap_GB": round(meter.moved / 1e9, 3),
                    "swap_GB_s": round(meter.moved / meter.seconds / 1e9, 2) if meter.seconds else 0.0,
                }
            if stats is not None:
                row["disk_loads"] = stats["slot"]["disk_loads"]
                row["turnstile_stats"] = stats
            rows.append(row | {"per_turn": _rows.per_turn(records)})
    server = next((r for r in rows if r["system"].startswith("llama-server")), None)
    for r in rows:
        r["wall_vs_server"] = round(r["wall_s"] / server["wall_s"], 3) if server else "-"
        r["prefill_vs_server"] = round(r["prefilled"] / server["prefilled"], 3) if server else "-"
    _cli.write(
        "long-context",
        rows,
        params=_cli.common_params(args, settings)
        | {
            "rounds": args.rounds,
            "doc_tokens": args.doc_tokens,
            "cache_ram_mib": mib,
            "command": "python -m benchmarks long-context " + " ".join(argv),
        },
        out=args.out,
        columns=COLUMNS,
    )
