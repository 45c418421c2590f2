"""`python -m benchmarks thinking`: what a thinking model's conversation costs per turn (Qwen3's real template).

(a) `render`: render + tokenize time of one turn (the history plus a reply with reasoning and a new user
message) at 10, 100 and 1,000 messages, with Qwen3's template (read from the vendored llama.cpp tree) on
SmolLM2's tokenizer (`--model`): the per-session incremental renderer (`PromptRenderer`, state kept from
the turn before) against a full render without message starts and with them (up to `--starts-upto`
messages). Qwen3's template renders the last assistant turn with its think block and earlier ones without,
so a renderer that resumes at the last user message re-renders every turn. `renders` and `chars_tokenized`
count the template renders and the characters tokenized for the timed turn. Min and median of `--reps`
runs (the min is the stable figure on a shared machine); `min_vs_10`: the min against the 10-message row.

(b) `hybrid`: a `--turns`-turn (default 20) thinking conversation on a tiny hybrid (Jamba-style) model with
Qwen3's template (`tests.support.thinking_models`), each output forced by the same raw GBNF grammar (a
think block, then a fixed answer). The template drops each reply's reasoning once the next user message
follows it, so the next prompt diverges at the end of the previous generation prompt. Per turn: the prompt,
the tokens the turn adds to the previous prompt (`new`: the previous answer and the new message), and the
tokens each system prefilled: turnstile (its checkpoint at the end of the generation prompt), turnstile
with `cache_rules="llama-server"` (llama-server's checkpoints only) and, with `--llama-server BIN` (or
TURNSTILE_LLAMA_SERVER), llama-server itself (`timings.prompt_n`; its replies and prompt sizes are checked
against turnstile's).

    python -m benchmarks thinking [--parts render,hybrid] [--sizes 10,100,1000] [--reps 20] [--starts-upto 100]
                                  [--turns 20] [--threads 1] [--model GGUF] [--llama-server BIN] [--out DIR]
"""

from __future__ import annotations

import os
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from benchmarks import _cli, _timing
from runtime import Runtime
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path
from runtime.llama.prompt import PromptRenderer
from runtime.types import CacheRules
from tests.support.llama_server import LlamaServer
from tests.support.thinking_models import forced_thought, qwen3_template, write_hybrid_thinking

RENDER_COLUMNS = ["messages", "path", "ms_min", "ms_median", "min_vs_10", "renders", "chars_tokenized"]
HYBRID_COLUMNS = ["turn", "prompt", "new", "turnstile", "turnstile_llama_server_rules", "llama_server"]
SYSTEM = "You are a helpful assistant. Think, then answer briefly."
N_CTX = 4096
MAX_TOKENS = 64


# --- (a) render ---------------------------------------------------------------------------------------


class _Counted:
    """A chat template that counts its text renders (everything else is the template's own)."""

    def __init__(self, template: Any) -> None:
        self._template = template
        self.renders = 0

    def render_text(self, *args: Any, **kwargs: Any) -> str:
        self.renders += 1
        return str(self._template.render_text(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._template, name)


def _conversation(n_turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for t in range(n_turns):
        msgs.append({"role": "user", "content": f"Turn {t}: tell me one short fact about the number {t}."})
        msgs.append(
            {
                "role": "assistant",
                "content": f"Here is fact number {t}: it is a number, and it matters because it is true.",
                "reasoning_content": f"The user asks about {t}. I should give one short true fact.",
            }
        )
    return msgs


def render_rows(model: str, sizes: list[int], reps: int, starts_upto: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with Engine(model, EngineConfig(n_ctx=512, n_threads=1, chat_template=qwen3_template())) as eng:
        tpl = eng.template
        msgs = _conversation(max(sizes) // 2 + 2)
        chars = [0]

        def tokenize(text: str, special: bool) -> list[int]:
            chars[0] += len(text)
            return eng.tokenize(text, add_special=special)

        for n in sizes:
            # n messages: the system message, the history and the new user message (n + 1 if n is odd)
            cur = msgs[:n] if msgs[n - 1]["role"] == "user" else msgs[: n + 1]
            prev = cur[:-2]
            counted = _Counted(tpl)
            r = PromptRenderer(counted, tokenize)  # type: ignore[arg-type]
            r.render(prev, "s")
            assert r.render(cur, "s").tokens == tpl.render(cur, spans=False).tokens  # the same prompt
            r.render(prev, "s")
            counted.renders, chars[0] = 0, 0
            r.render(cur, "s")
            work = {"incremental (per-session cache)": (counted.renders, chars[0])}
            paths = {
                "incremental (per-session cache)": _timing.min_median_ms(
                    partial(r.render, cur, "s"), reps, partial(r.render, prev, "s")
                ),
                "full render, no starts": _timing.min_median_ms(
                    partial(tpl.render, cur, spans=False), max(3, reps // 4)
                ),
            }
            work["full render, no starts"] = (1, len(tpl.render_text(cur, add_generation_prompt=True)))
            if len(cur) <= starts_upto:  # quadratic in the messages
                paths["full render + starts"] = _timing.min_median_ms(
                    partial(tpl.render, cur, spans=True), 1 if len(cur) > 200 else max(3, reps // 4)
                )
            for path, (low, mid) in paths.items():
                renders, tokenized = work.get(path, (None, None))
                rows.append(
                    {
                        "messages": len(cur),
                        "path": path,
                        "ms_min": low,
                        "ms_median": mid,
                        "renders": "" if renders is None else renders,
                        "chars_tokenized": "" if tokenized is None else tokenized,
                    }
                )
            _cli.progress(f"render: {len(cur)} messages done")
    base = {r["path"]: r["ms_min"] for r in rows if r["messages"] == rows[0]["messages"]}
    for row in rows:
        row["min_vs_10"] = row["ms_min"] / base[row["path"]]
    return rows


# --- (b) hybrid ---------------------------------------------------------------------------------------


def question(t: int) -> str:
    return f"question {t}: what is it"


async def _turnstile(model: Path, rules: CacheRules, turns: int, threads: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with Runtime.open(model, n_ctx=N_CTX, n_threads=threads, cache_rules=rules) as rt:
        for t in range(turns):
            r = await rt.chat("s", question(t), grammar=forced_thought(t), temperature=0, max_tokens=MAX_TOKENS)
            u = r.usage
            out.append(
                {"reasoning": r.reasoning, "text": r.text, "prompt": u.prompt_tokens, "prefilled": u.prefilled_tokens}
            )
    return out


def _server(binary: str, model: Path, turns: int, threads: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    msgs: list[dict[str, str]] = []
    with LlamaServer(binary, model, n_ctx=N_CTX, threads=threads, cache_ram_mib=256) as srv:
        for t in range(turns):
            msgs.append({"role": "user", "content": question(t)})
            r = srv.chat(msgs, max_tokens=MAX_TOKENS, grammar=forced_thought(t))
            reasoning = str(r.raw["choices"][0]["message"].get("reasoning_content") or "")
            out.append(
                {"reasoning": reasoning, "text": r.text, "prompt": r.cache_n + r.prompt_n, "prefilled": r.prompt_n}
            )
            msgs.append({"role": "assistant", "content": r.text, "reasoning_content": reasoning})
    return out


def hybrid_rows(turns: int, threads: int, binary: str | None) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="turnstile-thinking-") as d:
        model = write_hybrid_thinking(Path(d) / "qwen3-jamba.gguf")
        ours = anyio.run(_turnstile, model, "turnstile", turns, threads)
        _cli.progress("hybrid: turnstile done")
        ls_rules = anyio.run(_turnstile, model, "llama-server", turns, threads)
        _cli.progress("hybrid: turnstile with llama-server's rules done")
        server = _server(binary, model, turns, threads) if binary else None
        if server is not None:
            _cli.progress("hybrid: llama-server done")
    for other in (ls_rules, *([server] if server else [])):
        for a, b in zip(ours, other, strict=True):
            if (a["reasoning"], a["text"], a["prompt"]) != (b["reasoning"], b["text"], b["prompt"]):
                raise RuntimeError(f"the systems' turns differ: {a} != {b}")
    rows: list[dict[str, Any]] = []
    prev = 0
    for t in range(turns):
        n = ours[t]["prompt"]
        rows.append(
            {
                "turn": t + 1,
                "prompt": n,
                "new": n - prev,
                "turnstile": ours[t]["prefilled"],
                "turnstile_llama_server_rules": ls_rules[t]["prefilled"],
                "llama_server": server[t]["prefilled"] if server else "",
            }
        )
        prev = n
    total: dict[str, Any] = {"turn": "all", "prompt": sum(r["prompt"] for r in rows)}
    for col in HYBRID_COLUMNS[2:]:
        total[col] = sum(r[col] for r in rows) if rows and rows[0][col] != "" else ""
    return [*rows, total]


def main(argv: list[str]) -> None:
    ap = _cli.parser("thinking", __doc__)
    ap.add_argument("--parts", default="render,hybrid")
    ap.add_argument("--sizes", default="10,100,1000", help="messages for the render timing")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--starts-upto", type=int, default=100, help="largest size timed for the full render + starts")
    ap.add_argument("--turns", type=int, default=20, help="turns of the hybrid conversation")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=None, help="GGUF whose tokenizer the render part uses (default: SmolLM2)")
    ap.add_argument(
        "--llama-server",
        default=os.environ.get("TURNSTILE_LLAMA_SERVER"),
        metavar="BIN",
        help="a llama-server binary to compare with (default: $TURNSTILE_LLAMA_SERVER)",
    )
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    _cli.check_binary(ap, args.llama_server)
    parts = set(args.parts.split(","))
    if "render" in parts:
        model = args.model or str(default_model_path())
        rows = render_rows(model, [int(x) for x in args.sizes.split(",")], args.reps, args.starts_upto)
        params = {"model": Path(model).name, "template": "Qwen-Qwen3-0.6B.jinja", "reps": args.reps}
        _cli.write("thinking-render", rows, params=params, out=args.out, columns=RENDER_COLUMNS)
    if "hybrid" in parts:
        rows = hybrid_rows(args.turns, args.threads, args.llama_server)
        params = {
            "model": "tiny jamba (tests.support.thinking_models)",
            "template": "Qwen-Qwen3-0.6B.jinja",
            "turns": args.turns,
            "threads": args.threads,
            "n_ctx": N_CTX,
            "llama_server": args.llama_server,
        }
        _cli.write("thinking-hybrid", rows, params=params, out=args.out, columns=HYBRID_COLUMNS)
