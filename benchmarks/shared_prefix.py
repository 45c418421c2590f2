"""`python -m benchmarks shared-prefix`: what shared blocks store for agents sharing a long prefix, and
how fast a state is assembled from them.

Storage (`shared-prefix.json`): SmolLM2 evaluates a `--prefix` (1,500) token system prompt once; then
`--agents` (16) agents each play `--turns` (6) turns of `--turn-tokens` (64) tokens of their own, round
robin, the way the slot does it: an agent's first turn reuses the prefix already in the sequence
(truncate, evaluate its turn), a later turn restores the agent's state from the block store
(`BlockStore.get` + `Engine.state_set`) and evaluates the new turn; the new state is put in the store and
the agent's previous one released (a cache holds one state per conversation). Then `--forks` (4) forks of
agent 0 each add one turn of their own. Every held state is put into one store per `--blocks` size
(cells per block), all fed the same states. Columns:

- `unique_tokens`: tokens no two held states share (the prefix once, every agent's and fork's own turns);
  `kv_unique_MB`: their KV (the state's payload bytes per cell x unique tokens): the least any store holds;
- `stored_MB`: what the store holds (each block once, each state's frame and partial block);
  `x_unique`: stored / kv_unique (the issue's goal: <= 1.15); `whole_MB`: whole copies of the held states,
  `x_whole`: stored / whole.

Assembly (`shared-prefix-assembly.json`, unless `--assembly-tokens 0`): a `--assembly-tokens` (6,000)
token SmolLM2 state (~138 MB) is put into a store per block size; `assemble` is `BlockStore.get` into a
buffer of the pool (the state's bytes written once, each block's segments copied into place), `put, all
new` cuts every block, `put, all held` a second state of the same tokens (only hashing and the partial
block); memcpy into mapped memory is the yardstick (the issue's goal: >= 2 GB/s). `--state-file F` keeps
the 6,000-token prefill in F (the prefill is the slow part on a busy machine).

Served (`shared-prefix-turns.json` and `shared-prefix-turns-summary.json`, part `turns`): the same agents
and forks as chat turns through turnstile's Runtime (shared blocks, its lookup rule; with and without a
disk tier) and llama-server `-np 1 --cache-ram` at one RAM limit holding `--ram-states` (3) whole states,
alternated `--rounds` (2) times (`benchmarks._shared_turns`).

    python -m benchmarks shared-prefix [--agents 16] [--turns 6] [--prefix 1500] [--forks 4]
        [--blocks 16,32,64,128,256] [--assembly-tokens 6000] [--threads 2] [--state-file F]
        [--parts storage,assembly,turns] [--llama-server BIN] [--rounds 2] [--ram-states 3] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import _cli, _shared_turns, _timing
from benchmarks._workload import Settings
from caches import kvstate
from caches.blocks import BlockStore, StoredState
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.llama.models import default_model_path

COLUMNS = ["block_cells", "states", "unique_tokens", "kv_unique_MB", "stored_MB", "x_unique", "whole_MB", "x_whole"]
SPEED_COLUMNS = ["operation", "block_cells", "MB", "median_ms", "best_ms", "GB_s", "best_GB_s", "x_memcpy"]


def _text_tokens(eng: Engine, label: str, n: int) -> list[int]:
    words = " ".join(
        f"{label} note {i}: the keeper logged ship {i * 7} at dawn and checked the lamp." for i in range(n)
    )
    tokens = eng.tokenize(words, add_special=False)
    if len(tokens) < n:
        raise RuntimeError(f"{label}: {len(tokens)} tokens of text, {n} wanted")
    return tokens[:n]


def _decode(eng: Engine, tokens: list[int], pos: int) -> None:
    for start in range(0, len(tokens), eng.n_batch):
        eng.decode(tokens[start : start + eng.n_batch], pos + start, logits_last=False)


class _Stores:
    """One block store per block size, fed the same states; `held[key]` the refs of one state."""

    def __init__(self, sizes: list[int], namespace: bytes) -> None:
        self.stores = [BlockStore(b, namespace=namespace) for b in sizes]
        self.held: dict[str, list[StoredState]] = {}

    def put(self, key: str, tokens: list[int], state: memoryview, memory: kvstate.Memory) -> None:
        old = self.held.get(key)
        self.held[key] = [s.put(tokens, state, memory) for s in self.stores]
        if old is not None:
            for s, ref in zip(self.stores, old, strict=True):
                s.release(ref)

    def restore(self, key: str, eng: Engine) -> None:
        ref = self.held[key][0]
        if not eng.state_set(self.stores[0].get(ref)):
            raise RuntimeError(f"llama.cpp refused the assembled state of {key}")


def storage(args: argparse.Namespace, eng: Engine, sizes: list[int]) -> list[dict[str, Any]]:
    memory = kvstate.memory_of(str(eng.kind), eng.n_swa)
    stores = _Stores(sizes, (eng.fingerprint + eng.settings_key).encode())
    prefix = _text_tokens(eng, "system", args.prefix)
    _cli.progress(f"prefilling the {len(prefix)}-token prefix")
    eng.clear()
    _decode(eng, prefix, 0)
    history: dict[str, list[int]] = {}
    unique = len(prefix)
    t0 = time.perf_counter()
    for turn in range(args.turns):
        for a in range(args.agents):
            key = f"agent{a}"
            new = _text_tokens(eng, f"{key} turn {turn}", args.turn_tokens)
            if turn == 0:  # the slot holds the prefix (and another agent's turn): truncate to the prefix
                eng.seq_rm(len(prefix))
                history[key] = list(prefix)
            else:
                stores.restore(key, eng)
            _decode(eng, new, len(history[key]))
            history[key] += new
            unique += len(new)
            stores.put(key, history[key], eng.state_get(), memory)
        _cli.progress(f"turn {turn + 1}/{args.turns} done ({time.perf_counter() - t0:.0f} s)")
    for f in range(args.forks):
        key = f"fork{f}"
        new = _text_tokens(eng, f"{key} of agent0", args.turn_tokens)
        stores.restore("agent0", eng)
        _decode(eng, new, len(history["agent0"]))
        history[key] = history["agent0"] + new
        unique += len(new)
        stores.put(key, history[key], eng.state_get(), memory)
    for key in ("agent0", f"agent{args.agents - 1}"):  # what the store gives back is what was evaluated
        stores.restore(key, eng)
        if eng.pos_max() + 1 != len(history[key]):
            raise RuntimeError(f"{key}: restored {eng.pos_max() + 1} tokens of {len(history[key])}")
    cell_bytes = kvstate.parse(eng.state_get(), memory).cell_bytes
    rows: list[dict[str, Any]] = []
    for store in stores.stores:
        st = store.stats()
        kv_unique = unique * cell_bytes
        rows.append(
            {
                "block_cells": store.block_cells,
                "states": st.states,
                "unique_tokens": unique,
                "kv_unique_MB": round(kv_unique / 1e6, 2),
                "stored_MB": round(st.stored_bytes / 1e6, 2),
                "x_unique": round(st.stored_bytes / kv_unique, 3),
                "whole_MB": round(st.logical_bytes / 1e6, 2),
                "x_whole": round(st.stored_bytes / st.logical_bytes, 3),
                "blocks": st.blocks,
                "blocks_shared": st.blocks_shared,
                "kv_bytes_per_token": cell_bytes,
            }
        )
    return rows


def _row(name: str, block: int | str, nbytes: int, times: list[float], memcpy_s: float) -> dict[str, Any]:
    return {"operation": name, "block_cells": block, **_timing.throughput(nbytes, times, memcpy_s)}


def _speed(
    eng: Engine,
    store: BlockStore,
    tokens: list[int],
    state: memoryview,
    memory: kvstate.Memory,
    r: int,
    m_into: float,
) -> list[dict[str, Any]]:
    b, size = store.block_cells, len(state)
    refs: list[StoredState] = []

    def put_new() -> None:
        for ref in refs:
            store.release(ref)
        refs[:] = [store.put(tokens, state, memory)]

    rows = [_row("put, all new", b, size, _timing.times_s(put_new, r), m_into)]
    twin = store.put(tokens, state, memory)
    held = _timing.times_s(lambda: store.release(store.put(tokens, state, memory)), r)
    rows.append(_row("put, all held", b, size, held, m_into))
    out: list[memoryview] = [store.get(twin)]
    if bytes(out[0]) != bytes(state):
        raise RuntimeError(f"block size {b}: the assembled state is not the original")

    def get_one() -> None:
        out.append(store.get(twin))
        out.pop(0)  # a cache hands the state to llama.cpp and drops it: the pool reuses its memory

    rows.append(_row("assemble (get)", b, size, _timing.times_s(get_one, r), m_into))
    rows.append(_row("restore (state_set of it)", b, size, _timing.times_s(lambda: eng.state_set(out[-1]), r), m_into))
    return rows


def assembly(args: argparse.Namespace, eng: Engine, sizes: list[int]) -> list[dict[str, Any]]:
    memory = kvstate.memory_of(str(eng.kind), eng.n_swa)
    tokens = _text_tokens(eng, "document", args.assembly_tokens)
    saved = Path(args.state_file) if args.state_file else None
    if saved is not None and saved.is_file() and eng.state_set(saved.read_bytes()):
        _cli.progress(f"state loaded from {saved}")
    else:
        _cli.progress(f"prefilling {len(tokens)} tokens")
        eng.clear()
        _decode(eng, tokens, 0)
        if saved is not None:
            saved.write_bytes(eng.state_get())
    if eng.pos_max() + 1 != len(tokens):
        raise RuntimeError(f"the sequence holds {eng.pos_max() + 1} tokens, not {len(tokens)}")
    state = eng.state_get()
    size = len(state)
    r = args.repeat
    src = np.frombuffer(state, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    into = _timing.times_s(lambda: np.copyto(dst, src), r)
    m_into = statistics.median(into)
    rows = [_row("memcpy (into mapped memory)", "-", size, into, m_into)]
    for b in sizes:
        rows += _speed(eng, BlockStore(b), tokens, state, memory, r, m_into)
    return rows


def main(argv: list[str]) -> None:
    ap = _cli.parser("shared-prefix", __doc__)
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--prefix", type=int, default=1500, help="tokens of the shared system prompt")
    ap.add_argument("--turn-tokens", type=int, default=64, help="tokens each turn adds (message and reply)")
    ap.add_argument("--forks", type=int, default=4, help="forks of agent 0, one turn each")
    ap.add_argument("--blocks", default="16,32,64,128,256", help="block sizes (cells), comma-separated")
    ap.add_argument("--assembly-tokens", type=int, default=6000, help="tokens of the assembled state (0: skip)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--state-file", default=None, help="keep the assembly prefill here and reuse it")
    ap.add_argument("--skip-storage", action="store_true", help="leave out the storage part")
    ap.add_argument("--parts", default="storage,assembly,turns", help="which parts, comma-separated")
    ap.add_argument("--llama-server", default=None, metavar="BIN", help="a llama-server binary (part turns)")
    ap.add_argument("--systems", default=None, help=f"part turns: from {', '.join(_shared_turns.SYSTEMS)}")
    ap.add_argument("--rounds", type=int, default=2, help="part turns: runs of each system, alternated")
    ap.add_argument("--ram-states", type=int, default=3, help="part turns: whole final states the RAM limit holds")
    ap.add_argument("--max-tokens", type=int, default=32, help="part turns: tokens generated per turn at most")
    ap.add_argument("--block-cells", type=int, default=64, help="part turns: turnstile's shared_blocks")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write the JSON")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.blocks.split(",") if x]
    longest = args.prefix + args.turns * args.turn_tokens + args.turn_tokens
    if not sizes or min(sizes) < 1 or args.agents < 1 or args.turns < 1 or longest >= args.n_ctx:
        ap.error("--blocks must be positive, --agents and --turns at least 1, the longest history under --n-ctx")
    parts = set(args.parts.split(","))
    if parts - {"storage", "assembly", "turns"} or args.rounds < 1 or args.ram_states < 1:
        ap.error("--parts: from storage, assembly, turns; --rounds and --ram-states at least 1")
    if "assembly" in parts and (args.assembly_tokens >= args.n_ctx or args.repeat < 1):
        ap.error("--assembly-tokens must be under --n-ctx and --repeat at least 1")
    model = Path(args.model) if args.model else default_model_path()
    cfg = EngineConfig(n_ctx=args.n_ctx, n_threads=args.threads)
    params = {
        "model": model.name,
        "agents": args.agents,
        "turns": args.turns,
        "prefix": args.prefix,
        "turn_tokens": args.turn_tokens,
        "forks": args.forks,
        "threads": args.threads,
        "command": "python -m benchmarks shared-prefix " + " ".join(argv),
    }
    if parts & {"storage", "assembly"}:
        with Engine(model, cfg) as eng:
            if "storage" in parts and not args.skip_storage:
                _cli.write("shared-prefix", storage(args, eng, sizes), params=params, out=args.out, columns=COLUMNS)
            if "assembly" in parts and args.assembly_tokens:
                rows = assembly(args, eng, sizes)
                more = {**params, "assembly_tokens": args.assembly_tokens, "repeat": args.repeat}
                _cli.write("shared-prefix-assembly", rows, params=more, out=args.out, columns=SPEED_COLUMNS)
    if "turns" in parts:
        _cli.check_binary(ap, args.llama_server)
        if args.systems is None:
            args.systems = "turnstile,turnstile-disk" + (",server" if args.llama_server else "")
        settings = Settings(model=model, n_ctx=args.n_ctx, threads=args.threads, max_tokens=args.max_tokens)
        partial = _cli.out_path(args.out, "shared-prefix-turns-partial")

        def keep(runs: list[dict[str, Any]]) -> None:  # what is measured so far, if the run is cut short
            if partial is not None:
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps({"params": params, "rows": runs}, indent=1))

        runs, summary, more = _shared_turns.run_turns(args, settings, keep)
        more = {**params, **more, "llama_server": args.llama_server}
        _cli.write("shared-prefix-turns", runs, params=more, out=args.out, columns=_shared_turns.RUN_COLUMNS)
        cols = _shared_turns.SUMMARY_COLUMNS
        _cli.write("shared-prefix-turns-summary", summary, params=more, out=args.out, columns=cols)
