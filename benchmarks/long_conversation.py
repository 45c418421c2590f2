"""`python -m benchmarks long-conversation`: one conversation far longer than the context, at a flat cost.

(a) `window`: a conversation of `--turns` turns (default 300) on SmolLM2 with n_ctx 2048, context="window",
greedy 32-token replies (ignore_eos). For each keep fraction (`--keeps`, the share of the budget a cut
keeps) and for the naive policy (keep 1.0: drop just enough turns, every turn), the prefill per turn is
compared with the ideal: what an unbounded context with a perfect cache would prefill, i.e. the tokens of
the full, unwindowed prompt that the previous full prompt plus its generated tokens do not hold (at least
one). `ratio` = total prefilled / total ideal. The naive policy re-prefills nearly the whole window every
turn once the window is full, so it runs `--naive-turns` turns only.

(a') `plan`: the same conversation's token accounting without running the model (fast): replies are a
fixed 32-token text, the prompts come from the real `ContextWindow` and renderer, and the prefill of a turn
is what the slot computes for one conversation whose state stays in it (the prompt less its common prefix
with the previous prompt + generated tokens, at least one). Used to choose the keep fraction.

(b) `render`: render + tokenize time of one turn (the history plus a reply and a new user message) at 10,
100 and 1,000 messages: the per-session incremental renderer (`runtime.llama.prompt.PromptRenderer`, state
kept from the turn before) against a full render without message starts (what transformers did) and with
them (what checkpoint models did: every prefix tokenized). Min and median of `--reps` runs (the min is
the stable figure on a shared machine).

    python -m benchmarks long-conversation [--turns 300] [--naive-turns 80] [--keeps 0.125,0.2,0.25,0.5]
                                           [--sizes 10,100,1000] [--reps 20] [--starts-upto 1000] [--threads 2]
                                           [--parts plan,window,render]
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from benchmarks import _cli, _timing
from caches.tokens import lcp
from runtime import Runtime
from runtime.backend.protocol import WHOLE, RenderOptions
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path
from runtime.llama.prompt import PromptRenderer
from runtime.loop.context import ContextWindow

WINDOW_COLUMNS = [
    "policy",
    "keep",
    "turns",
    "cuts",
    "prefilled_per_turn",
    "ideal_per_turn",
    "ratio",
    "prompt_mean",
    "prefill_s_per_turn",
    "total_s",
]
RENDER_COLUMNS = ["messages", "path", "ms_min", "ms_median", "min_vs_10"]
N_CTX = 2048
MAX_TOKENS = 32
SYSTEM = "You are a helpful assistant. Answer briefly."


def user_message(t: int) -> str:
    topics = ["the sea", "the moon", "a cat", "trees", "ships", "the sun", "stars", "code"]
    return f"Turn {t}: tell me one short fact about {topics[t % len(topics)]}, and why it matters."


async def _window_run(model: str, keep: float, turns: int, threads: int) -> dict[str, Any]:
    gen = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    async with Runtime.open(model, n_ctx=N_CTX, n_threads=threads, cache_ram_mib=256) as rt:
        rt._turns.window.keep = keep  # the naive policy and other keep fractions, for comparison only
        backend: Any = rt.backend
        tpl = backend.engine.template
        await rt.create_session("w", system=SYSTEM, context="window")
        prefilled = ideal = prompt_total = cuts = 0
        prefill_s = 0.0
        prev_full: list[int] = []
        prev_dropped = 0
        t0 = time.perf_counter()
        for t in range(turns):
            session = await rt.get_session("w")
            full = tpl.render([*session.chat_messages(), {"role": "user", "content": user_message(t)}], spans=False)
            r = await rt.chat("w", user_message(t), **gen)
            held = prev_full
            n = len(full.tokens)
            ideal += n - min(lcp(held, full.tokens), n - 1)
            settled = backend.slot.last.tokens(backend.slot.tokens)  # the reply's last token too, once settled
            prev_full = [*full.tokens, *settled[r.usage.prompt_tokens :]]
            prefilled += r.usage.prefilled_tokens
            prompt_total += r.usage.prompt_tokens
            prefill_s += r.timings.prefill
            cuts += r.usage.dropped_messages != prev_dropped
            prev_dropped = r.usage.dropped_messages
            if (t + 1) % 25 == 0:
                _cli.progress(f"keep {keep}: turn {t + 1}/{turns}, ratio so far {prefilled / max(ideal, 1):.2f}")
        total = time.perf_counter() - t0
    row = _window_row(keep, turns, cuts=cuts, prefilled=prefilled, ideal=ideal, prompt_total=prompt_total)
    return row | {"prefill_s_per_turn": prefill_s / turns, "total_s": total}


def _window_row(keep: float, turns: int, *, cuts: int, prefilled: int, ideal: int, prompt_total: int) -> dict[str, Any]:
    """A window policy's row: its cuts, prefilled and ideal tokens per turn, their ratio and the mean prompt."""
    return {
        "policy": "naive (drop one turn)" if keep >= 1.0 else "window",
        "keep": keep,
        "turns": turns,
        "cuts": cuts,
        "prefilled_per_turn": prefilled / turns,
        "ideal_per_turn": ideal / turns,
        "ratio": prefilled / max(ideal, 1),
        "prompt_mean": prompt_total / turns,
    }


class _RenderOnly:
    """A stand-in for the slot backend that only renders (the `plan` part)."""

    def __init__(self, eng: Engine) -> None:
        self.n_ctx = N_CTX
        self.prompts = PromptRenderer(eng.template, lambda text, special: eng.tokenize(text, add_special=special))

    def prepare(self, messages: Any, session_id: str | None = None, options: RenderOptions = WHOLE) -> Any:
        # the plan's conversation offers no tools, sets no variables
        assert options.tools is None and not options.template_kwargs
        return self.prompts.render(messages, session_id)


def plan_rows(model: str, keeps: list[float], turns: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with Engine(model, EngineConfig(n_ctx=512, n_threads=1)) as eng:
        gen = eng.tokenize("The sea is vast and deep, and it covers most of our planet. " * 3, add_special=False)
        gen = gen[:MAX_TOKENS]
        reply = eng.detokenize(gen)
        for keep in keeps:
            window, backend = ContextWindow(keep=keep), _RenderOnly(eng)
            msgs: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
            slot: list[int] = []
            held: list[int] = []
            prefilled = ideal = prompt_total = cuts = dropped = 0
            for t in range(turns):
                msgs.append({"role": "user", "content": user_message(t)})
                p = window.prepare(backend, "s", msgs, "window", MAX_TOKENS)  # type: ignore[arg-type]
                prompt = p.rendered.tokens
                prefilled += len(prompt) - min(lcp(slot, prompt), len(prompt) - 1)
                full = eng.template.render(msgs, spans=False).tokens
                ideal += len(full) - min(lcp(held, full), len(full) - 1)
                slot, held = [*prompt, *gen[:-1]], [*full, *gen[:-1]]
                cuts += p.dropped != dropped
                dropped = p.dropped
                prompt_total += len(prompt)
                msgs.append({"role": "assistant", "content": reply})
            rows.append(
                _window_row(keep, turns, cuts=cuts, prefilled=prefilled, ideal=ideal, prompt_total=prompt_total)
            )
    return rows


def _conversation(n: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for t in range(n):
        msgs.append({"role": "user", "content": user_message(t)})
        msgs.append({"role": "assistant", "content": f"Here is fact number {t}: it matters because it is true. ✓"})
    return msgs


def render_rows(model: str, sizes: list[int], reps: int, starts_upto: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with Engine(model, EngineConfig(n_ctx=512, n_threads=1)) as eng:
        tpl = eng.template
        msgs = _conversation(max(sizes) // 2 + 2)
        for n in sizes:
            # n messages: the system message, the history and the new user message (n + 1 if n is odd)
            cur = msgs[:n] if msgs[n - 1]["role"] == "user" else msgs[: n + 1]
            prev = cur[:-2]
            r = PromptRenderer(tpl, lambda text, special: eng.tokenize(text, add_special=special))
            r.render(prev, "s")
            assert r.render(cur, "s").tokens == tpl.render(cur, spans=False).tokens
            paths = {
                "incremental (per-session cache)": _timing.min_median_ms(
                    lambda r=r, cur=cur: r.render(cur, "s"), reps, lambda r=r, prev=prev: r.render(prev, "s")
                ),
                "full render, no starts": _timing.min_median_ms(
                    lambda cur=cur: tpl.render(cur, spans=False), max(3, reps // 4)
                ),
            }
            if len(cur) <= starts_upto:  # quadratic: minutes at 1,000 messages
                paths["full render + starts"] = _timing.min_median_ms(
                    lambda cur=cur: tpl.render(cur, spans=True), 1 if len(cur) > 200 else max(3, reps // 4)
                )
            for path, (low, mid) in paths.items():
                rows.append({"messages": len(cur), "path": path, "ms_min": low, "ms_median": mid})
            _cli.progress(f"render: {len(cur)} messages done")
    base = {r["path"]: r["ms_min"] for r in rows if r["messages"] == rows[0]["messages"]}
    for row in rows:
        row["min_vs_10"] = row["ms_min"] / base[row["path"]]
    return rows


def main(argv: list[str]) -> None:
    ap = _cli.parser("long-conversation", __doc__)
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--naive-turns", type=int, default=80, help="turns of the naive policy (0: skip it)")
    ap.add_argument("--keeps", default="0.125,0.2,0.25,0.5", help="keep fractions of the window policy")
    ap.add_argument("--sizes", default="10,100,1000", help="messages for the render timing")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--starts-upto", type=int, default=1000, help="largest size timed for the full render + starts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--parts", default="plan,window,render")
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    model = args.model or str(default_model_path())
    parts = set(args.parts.split(","))
    params = {"model": model, "n_ctx": N_CTX, "max_tokens": MAX_TOKENS, "threads": args.threads}
    if "render" in parts:
        rows = render_rows(model, [int(x) for x in args.sizes.split(",")], args.reps, args.starts_upto)
        _cli.write(
            "long-conversation-render", rows, params=params | {"reps": args.reps}, out=args.out, columns=RENDER_COLUMNS
        )
    if "plan" in parts:
        keeps = [float(k) for k in args.keeps.split(",")] + [1.0]
        rows = plan_rows(model, keeps, args.turns)
        _cli.write("long-conversation-plan", rows, params=params, out=args.out, columns=WINDOW_COLUMNS[:-2])
    if "window" in parts:
        runs = [(float(k), args.turns) for k in args.keeps.split(",")]
        if args.naive_turns:
            runs.append((1.0, args.naive_turns))
        rows = [anyio.run(_window_run, model, keep, turns, args.threads) for keep, turns in runs]
        _cli.write("long-conversation", rows, params=params, out=args.out, columns=WINDOW_COLUMNS)
