"""`python -m benchmarks responses`: a 20-turn conversation through the Responses API's
`previous_response_id` (only the new input travels) against the same conversation resent whole through
chat completions (turnstile) and through llama-server's stateless `/v1/responses`.

Per system: request bytes (the JSON bodies sent), tokens prefilled (input tokens less cached ones), in
all and on the last turn, and wall time. Greedy, SmolLM2 by default; the per-turn figures are in the JSON.

    python -m benchmarks responses [--turns 20] [--max-tokens 32] [--model PATH] [--llama-server BIN] [--out DIR]
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from benchmarks import _cli
from runtime.testing.llama_server import LlamaServer
from runtime.testing.process import ServeProcess

COLUMNS = ["system", "turns", "request_bytes", "last_request_bytes", "prefilled", "last_prefilled", "wall_s"]
TOPICS = "tea,rivers,owls,bread,glass,maps,snow,bees,clocks,salt,ships,moss,kites,iron,rain,silk,caves,ink,wolves,rice"


def _questions(n: int) -> list[str]:
    topics = TOPICS.split(",")
    return [f"Tell me one short fact about {topics[i % len(topics)]}." for i in range(n)]


def _post(c: httpx.Client, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    raw = json.dumps(body).encode()
    r = c.post(path, content=raw, headers={"content-type": "application/json"}, timeout=600)
    r.raise_for_status()
    return len(raw), r.json()


def _chained(url: str, questions: list[str], gen: dict[str, Any]) -> list[dict[str, Any]]:
    turns, prev = [], None
    with httpx.Client(base_url=url) as c:
        for q in questions:
            t0 = time.perf_counter()
            size, r = _post(c, "/v1/responses", {"input": q, "previous_response_id": prev, **gen})
            prev, u = r["id"], r["usage"]
            cached = u["input_tokens_details"]["cached_tokens"]
            turns.append({"bytes": size, "prefilled": u["input_tokens"] - cached, "wall": time.perf_counter() - t0})
    return turns


def _whole(url: str, questions: list[str], gen: dict[str, Any], api: str) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    history: list[dict[str, str]] = []
    with httpx.Client(base_url=url) as c:
        for q in questions:
            history.append({"role": "user", "content": q})
            t0 = time.perf_counter()
            if api == "chat":
                body = {"messages": history, "max_tokens": gen["max_output_tokens"], "temperature": 0.0}
                size, r = _post(c, "/v1/chat/completions", body)
                text, u = r["choices"][0]["message"]["content"] or "", r["usage"]
                prompt, cached = u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]
            else:
                items = [{"type": "message", **m} if m["role"] == "assistant" else m for m in history]
                size, r = _post(c, "/v1/responses", {"input": items, **gen})  # llama-server wants the type
                text = "".join(p["text"] for o in r["output"] if o["type"] == "message" for p in o["content"])
                u = r["usage"]
                prompt, cached = u["input_tokens"], u["input_tokens_details"]["cached_tokens"]
            history.append({"role": "assistant", "content": text})
            turns.append({"bytes": size, "prefilled": prompt - cached, "wall": time.perf_counter() - t0})
    return turns


def _row(system: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "system": system,
        "turns": len(turns),
        "request_bytes": sum(t["bytes"] for t in turns),
        "last_request_bytes": turns[-1]["bytes"],
        "prefilled": sum(t["prefilled"] for t in turns),
        "last_prefilled": turns[-1]["prefilled"],
        "wall_s": round(sum(t["wall"] for t in turns), 2),
        "per_turn": [{"bytes": t["bytes"], "prefilled": t["prefilled"]} for t in turns],
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
    rows = []
    with ServeProcess(*serve) as srv:
        _cli.progress(f"turnstile, previous_response_id: {len(questions)} turns")
        rows.append(_row("turnstile responses + previous_response_id", _chained(srv.url, questions, gen)))
    with ServeProcess(*serve) as srv:
        _cli.progress("turnstile, chat completions resent whole")
        rows.append(_row("turnstile chat completions, whole history", _whole(srv.url, questions, gen, "chat")))
    if args.llama_server:
        with LlamaServer(args.llama_server, model, n_ctx=8192, threads=args.threads, cache_ram_mib=8192) as ls:
            _cli.progress("llama-server /v1/responses resent whole")
            rows.append(_row("llama-server responses, whole history", _whole(ls.url, questions, gen, "responses")))
    params = {"model": model.name, "turns": args.turns, "max_tokens": args.max_tokens, "threads": args.threads}
    _cli.write("responses", rows, params=params, out=args.out, columns=COLUMNS)
