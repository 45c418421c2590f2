"""`python -m benchmarks responses`: a 20-turn conversation through the Responses API's
`previous_response_id` (only the new input travels) against the same conversation resent whole through
chat completions (turnstile) and through llama-server's stateless `/v1/responses`.

Per system: request bytes (the JSON bodies sent), tokens prefilled (input tokens less cached ones), in
all and on the last turn, the last turn's cached tokens, and wall time (the sum and the median turn). The
servers run side by side and the systems take turns (turn 1 on each, then turn 2 ..., in an order that
rotates), so a shared machine's load falls on all of them alike. Greedy, SmolLM2 by default; the per-turn
figures are in the JSON.

    python -m benchmarks responses [--turns 20] [--max-tokens 32] [--model PATH] [--llama-server BIN] [--out DIR]
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from benchmarks import _cli
from tests.support.llama_server import LlamaServer
from tests.support.process import ServeProcess

COLUMNS = [
    "system",
    "turns",
    "request_bytes",
    "last_request_bytes",
    "prefilled",
    "last_prefilled",
    "last_cached",
    "wall_s",
    "median_turn_s",
]
TOPICS = "tea,rivers,owls,bread,glass,maps,snow,bees,clocks,salt,ships,moss,kites,iron,rain,silk,caves,ink,wolves,rice"


def _questions(n: int) -> list[str]:
    topics = TOPICS.split(",")
    return [f"Tell me one short fact about {topics[i % len(topics)]}." for i in range(n)]


def _post(c: httpx.Client, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    raw = json.dumps(body).encode()
    r = c.post(path, content=raw, headers={"content-type": "application/json"}, timeout=600)
    r.raise_for_status()
    return len(raw), r.json()


class _Chained:
    """The conversation through `previous_response_id`: each request carries only its new input."""

    def __init__(self, client: httpx.Client, gen: dict[str, Any]) -> None:
        self.client, self.gen, self.prev = client, gen, None

    def turn(self, q: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        size, r = _post(self.client, "/v1/responses", {"input": q, "previous_response_id": self.prev, **self.gen})
        wall = time.perf_counter() - t0
        self.prev, u = r["id"], r["usage"]
        cached = u["input_tokens_details"]["cached_tokens"]
        return {"bytes": size, "prefilled": u["input_tokens"] - cached, "cached": cached, "wall": wall}


class _Whole:
    """The conversation resent whole each turn, statelessly: chat completions or llama-server's `/v1/responses`."""

    def __init__(self, client: httpx.Client, gen: dict[str, Any], api: str) -> None:
        self.client, self.gen, self.api = client, gen, api
        self.history: list[dict[str, str]] = []

    def turn(self, q: str) -> dict[str, Any]:
        self.history.append({"role": "user", "content": q})
        t0 = time.perf_counter()
        if self.api == "chat":
            body = {"messages": self.history, "max_tokens": self.gen["max_output_tokens"], "temperature": 0.0}
            size, r = _post(self.client, "/v1/chat/completions", body)
            wall = time.perf_counter() - t0
            text, u = r["choices"][0]["message"]["content"] or "", r["usage"]
            prompt, cached = u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]
        else:
            items = [{"type": "message", **m} if m["role"] == "assistant" else m for m in self.history]
            size, r = _post(self.client, "/v1/responses", {"input": items, **self.gen})  # llama-server wants the type
            wall = time.perf_counter() - t0
            text = "".join(p["text"] for o in r["output"] if o["type"] == "message" for p in o["content"])
            u = r["usage"]
            prompt, cached = u["input_tokens"], u["input_tokens_details"]["cached_tokens"]
        self.history.append({"role": "assistant", "content": text})
        return {"bytes": size, "prefilled": prompt - cached, "cached": cached, "wall": wall}


def _row(system: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "system": system,
        "turns": len(turns),
        "request_bytes": sum(t["bytes"] for t in turns),
        "last_request_bytes": turns[-1]["bytes"],
        "prefilled": sum(t["prefilled"] for t in turns),
        "last_prefilled": turns[-1]["prefilled"],
        "last_cached": turns[-1]["cached"],
        "wall_s": round(sum(t["wall"] for t in turns), 2),
        "median_turn_s": round(statistics.median(t["wall"] for t in turns), 3),
        "per_turn": [{k: round(v, 3) if k == "wall" else v for k, v in t.items()} for t in turns],
    }


def main(argv: list[str]) -> None:
    ap = _cli.parser("responses", __doc__)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="a GGUF model (default: SmolLM2-135M)")
    ap.add_argument("--llama-server", default=os.environ.get("TURNSTILE_LLAMA_SERVER"), metavar="BIN")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write responses.json")
    args = ap.parse_args(argv)
    _cli.check_binary(ap, args.llama_server)
    from runtime.llama.models import default_model_path

    model = Path(args.model) if args.model else default_model_path()
    questions = _questions(args.turns)
    gen = {"max_output_tokens": args.max_tokens, "temperature": 0.0}
    serve = ["--model", str(model), "--ctx", "8192", "--threads", str(args.threads)]
    with contextlib.ExitStack() as stack:

        def client(url: str) -> httpx.Client:
            return stack.enter_context(httpx.Client(base_url=url))

        systems: list[tuple[str, _Chained | _Whole]] = []
        url = stack.enter_context(ServeProcess(*serve)).url
        systems.append(("turnstile responses + previous_response_id", _Chained(client(url), gen)))
        url = stack.enter_context(ServeProcess(*serve)).url
        systems.append(("turnstile chat completions, whole history", _Whole(client(url), gen, "chat")))
        if args.llama_server:
            ls = stack.enter_context(
                LlamaServer(args.llama_server, model, n_ctx=8192, threads=args.threads, cache_ram_mib=8192)
            )
            systems.append(("llama-server responses, whole history", _Whole(client(ls.url), gen, "responses")))
        played: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in systems}
        for i, q in enumerate(questions):
            # the systems take turns, in an order that rotates: machine load falls on all of them alike
            for k in range(len(systems)):
                name, system = systems[(i + k) % len(systems)]
                played[name].append(system.turn(q))
            walls = ", ".join(f"{played[name][-1]['wall']:.2f}" for name, _ in systems)
            _cli.progress(f"turn {i + 1} of {len(questions)}: {walls} s")
        rows = [_row(name, played[name]) for name, _ in systems]
    params = {"model": model.name, "turns": args.turns, "max_tokens": args.max_tokens, "threads": args.threads}
    _cli.write("responses", rows, params=params, out=args.out, columns=COLUMNS)
