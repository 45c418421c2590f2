"""The shared-prefix benchmark's served part (`python -m benchmarks shared-prefix --part turns`).

`--agents` (16) agents share one `--prefix` (1,500) token system prompt and play `--turns` (6) turns each,
round robin; then `--forks` (4) forks of agent 0 (its whole history) add one turn each. The systems, all
with the same RAM limit, `--ram-states` (3) whole states of an agent's final history (SmolLM2's KV bytes per
token x the longest history, rounded up to MiB):

- `turnstile`: `Runtime.open(shared_blocks=64, cache_ram_mib=LIMIT)`, turnstile's rules (the lookup rule,
  limits counting the bytes the blocks hold), no disk tier;
- `turnstile-disk`: the same with a disk tier (a fresh temporary data_dir each round);
- `server`: llama-server `-np 1 --cache-ram LIMIT` (`--llama-server BIN`).

Systems are alternated `--rounds` times (A B C, then C B A, ...). Per run: prefilled tokens, "ideal" (each
turn's tokens that no earlier state of any conversation holds, measured on turnstile's token lists: the
new message and what of the previous reply re-renders differently), wall time, the turns whose text equals
the first turnstile run's, RAM / disk loads. The summary: per system the median wall and its spread
(min-max), and prefilled tokens and wall against llama-server's.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks import _cli
from benchmarks._systems import ServerSystem, TurnstileSystem
from benchmarks._workload import N_BATCH, N_UBATCH, ChatSystem, Settings
from caches.tokens import lcp
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from tests.support.workloads import Messages

__all__ = ["RUN_COLUMNS", "SUMMARY_COLUMNS", "run_turns"]

RUN_COLUMNS = ["system", "round", "turns", "prompt_tokens", "prefilled", "ideal", "x_ideal", "wall_s", "same_text"]
RUN_COLUMNS += ["ram_loads", "disk_loads", "ram_held_MB", "ram_whole_MB"]
SUMMARY_COLUMNS = ["system", "prefilled", "x_fewer_prefilled", "wall_median_s", "wall_min_s", "wall_max_s"]
SUMMARY_COLUMNS += ["x_wall"]
SYSTEMS = ("turnstile", "turnstile-disk", "server")
MSG_TOKENS = 32


def _system_text(eng: Engine, n: int) -> str:
    """A system prompt of about `n` tokens: tool schemas and rules, as an agent framework writes them."""
    lines = [
        f"Tool {i}: name=tool_{i}, parameters={{'target': 'string', 'count': 'integer {i}'}}; use it for task {i * 3}."
        for i in range(n)
    ]
    text = "You are an agent of the lighthouse crew. Rules and tools follow.\n"
    for line in lines:
        if len(eng.tokenize(text + line + "\n", add_special=False)) > n:
            break
        text += line + "\n"
    return text


def _user(conv: int, turn: int) -> str:
    return f"Agent {conv}, step {turn}: report the state of lamp {conv * 7 + turn} and the tide at hour {turn}."


def _messages(
    system: str, agents: int, turns: int, conv: int, turn: int, replies: dict[tuple[int, int], str]
) -> Messages:
    src, upto = (conv, turn) if conv < agents else (0, turns)  # a fork: agent 0's whole history, then its own
    msgs: Messages = [{"role": "system", "content": system}]
    for t in range(upto):
        msgs += [{"role": "user", "content": _user(src, t)}, {"role": "assistant", "content": replies[src, t]}]
    return [*msgs, {"role": "user", "content": _user(conv, turn)}]


def _ram_mib(settings: Settings, prefix: int, turns: int, states: int) -> tuple[int, int]:
    """(RAM limit in MiB holding `states` whole final states, KV bytes per token)."""
    cfg = EngineConfig(n_ctx=settings.n_ctx, n_threads=settings.threads, n_batch=N_BATCH, n_ubatch=N_UBATCH)
    with Engine(settings.model, cfg) as eng:
        toks = eng.tokenize("the keeper logged the ship at dawn " * 80, add_special=False)[:512]
        eng.decode(toks[:256], 0, logits_last=False)
        small = eng.state_size()
        eng.decode(toks[256:512], 256, logits_last=False)
        per_token = (eng.state_size() - small) // 256
    longest = prefix + turns * (MSG_TOKENS + settings.max_tokens + 10)
    return math.ceil(states * (small + per_token * (longest - 256)) / (1 << 20)), per_token


def _play(
    system: ChatSystem, label: str, sys_text: str, args: Any, reference: dict[tuple[int, int], str] | None
) -> dict[str, Any]:
    schedule = [(a, t) for t in range(args.turns) for a in range(args.agents)]
    schedule += [(args.agents + f, args.turns) for f in range(args.forks)]
    replies: dict[tuple[int, int], str] = {}
    seen: list[list[int]] = []  # every state turnstile's slot held after a turn (for the ideal)
    prompt = prefilled = ideal = same = 0
    t0 = time.perf_counter()
    for conv, turn in schedule:
        if conv >= args.agents and isinstance(system, TurnstileSystem):
            system.fork(0, conv)
        msgs = _messages(sys_text, args.agents, args.turns, conv, turn, replies)
        out = system.turn(conv, msgs)
        replies[conv, turn] = out.text
        prompt += out.prompt_tokens
        prefilled += out.prefilled
        same += reference is not None and reference.get((conv, turn)) == out.text
        if isinstance(system, TurnstileSystem):
            tokens = system.rt.backend.engine.render(msgs, spans=False).tokens
            ideal += len(tokens) - max((lcp(tokens, s) for s in seen), default=0)
            seen.append(system.states[conv])
    wall = time.perf_counter() - t0
    row: dict[str, Any] = {
        "system": label,
        "turns": len(schedule),
        "prompt_tokens": prompt,
        "prefilled": prefilled,
        "ideal": ideal or "",
        "x_ideal": round(prefilled / ideal, 3) if ideal else "",
        "wall_s": round(wall, 2),
        "same_text": f"{same}/{len(schedule)}" if reference is not None else "-",
        "replies": {f"{c},{t}": text for (c, t), text in replies.items()},
    }
    if isinstance(system, TurnstileSystem):
        st = system.rt.stats().slot
        row |= {"ram_loads": st.ram_loads, "disk_loads": st.disk_loads}
        row |= {"ram_held_MB": round(st.ram_held_bytes / 1e6, 1), "ram_whole_MB": round(st.ram_bytes / 1e6, 1)}
    return row


def run_turns(
    args: Any, settings: Settings, on_run: Callable[[list[dict[str, Any]]], None] = lambda runs: None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Every system `args.rounds` times, alternated: (per-run rows, summary rows, params); `on_run` gets the
    rows so far after each run (a long run killed midway keeps what it measured)."""
    names = [n for n in args.systems.split(",") if n]
    if any(n not in SYSTEMS for n in names) or ("server" in names and not args.llama_server):
        raise SystemExit(f"--systems: from {', '.join(SYSTEMS)} ('server' needs --llama-server)")
    mib, per_token = _ram_mib(settings, args.prefix, args.turns, args.ram_states)
    cfg = EngineConfig(n_ctx=settings.n_ctx, n_threads=settings.threads)
    with Engine(settings.model, cfg) as eng:
        sys_text = _system_text(eng, args.prefix)
        n_prefix = len(eng.tokenize(sys_text, add_special=False))
    makers: dict[str, Callable[[str], ChatSystem]] = {
        "turnstile": lambda _: TurnstileSystem(
            "turnstile", settings, cache_ram_mib=mib, options={"shared_blocks": args.block_cells}
        ),
        "turnstile-disk": lambda tmp: TurnstileSystem(
            "turnstile-disk", settings, cache_ram_mib=mib, data_dir=tmp, options={"shared_blocks": args.block_cells}
        ),
        "server": lambda _: ServerSystem("server", settings, args.llama_server, cache_ram_mib=mib),
    }
    runs: list[dict[str, Any]] = []
    reference: dict[tuple[int, int], str] | None = None
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            _cli.progress(f"round {r + 1}/{args.rounds}: {name}")
            with _cli.temp_dir("turnstile-shared-turns-") as tmp:
                system = makers[name](tmp)
                try:
                    row = _play(system, name, sys_text, args, reference)
                finally:
                    system.close()
            if reference is None and name.startswith("turnstile"):
                reference = {(int(k.split(",")[0]), int(k.split(",")[1])): v for k, v in row["replies"].items()}
            runs.append({"round": r + 1, **row})
            on_run(runs)
    summary: list[dict[str, Any]] = []
    by = {n: [x for x in runs if x["system"] == n] for n in names}
    base = by.get("server")
    for n in names:
        walls = [x["wall_s"] for x in by[n]]
        pre = statistics.median(x["prefilled"] for x in by[n])
        row = {"system": n, "prefilled": pre, "wall_median_s": round(statistics.median(walls), 2)}
        row |= {"wall_min_s": min(walls), "wall_max_s": max(walls)}
        if base:
            row["x_fewer_prefilled"] = round(statistics.median(x["prefilled"] for x in base) / pre, 2) if pre else ""
            row["x_wall"] = round(statistics.median(walls) / statistics.median(x["wall_s"] for x in base), 3)
        summary.append(row)
    params = {"ram_limit_mib": mib, "ram_states": args.ram_states, "kv_bytes_per_token": per_token}
    params |= {"prefix_tokens": n_prefix, "rounds": args.rounds, "max_tokens": settings.max_tokens}
    return runs, summary, params
