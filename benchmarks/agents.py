"""Replay what real coding agents sent (recorded by tests/serve/test_clients.py under the ignored
`.cache/recorded/CLIENT/`: one JSON body a request, and `model.json`, the scripted model they ran on) against
`turnstile serve` and llama-server `-np 1 --cache-ram`, per turn: prompt, cached and prefilled tokens; then
the same session against a restarted turnstile with a data dir (the first turn served from the disk tier).

    python -m benchmarks agents [--recorded DIR] [--llama-server BIN]
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx2 as httpx

from benchmarks._cli import check_binary, parser, progress, write
from tests.support.llama_server import LlamaServer
from tests.support.process import ServeProcess
from tests.support.scripted_models import write_tool_caller

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / ".cache" / "recorded"


def _usage(path: str, body: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of a reply in its dialect's usage shape."""
    u = body.get("usage") or {}
    if path.endswith("responses"):
        return u["input_tokens"], (u.get("input_tokens_details") or {}).get("cached_tokens", 0)
    if path.endswith("messages"):
        read = u.get("cache_read_input_tokens", 0)
        return u["input_tokens"] + read, read
    return u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def _replay(url: str, bodies: list[Path], system: str, client: str) -> list[dict[str, Any]]:
    rows = []
    for turn, p in enumerate(bodies, 1):
        path = "/" + p.stem.split("-", 1)[1].replace("-", "/")
        body = {**json.loads(p.read_bytes()), "stream": False}
        r = httpx.post(url + path, json=body, timeout=3600)
        r.raise_for_status()
        prompt, cached = _usage(path, r.json())
        rows.append({"client": client, "system": system, "turn": turn, "prompt": prompt, "cached": cached,
                     "prefilled": prompt - cached})  # fmt: skip
        progress(f"{client} {system} turn {turn}: {prompt} prompt, {cached} cached")
    return rows


def main(argv: list[str]) -> None:
    ap = parser("agents", __doc__)
    ap.add_argument("--recorded", default=str(RECORDED), metavar="DIR")
    ap.add_argument("--llama-server", default=os.environ.get("TURNSTILE_LLAMA_SERVER"), metavar="BIN")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    check_binary(ap, args.llama_server)
    rows: list[dict[str, Any]] = []
    for d in sorted(p for p in Path(args.recorded).iterdir() if (p / "model.json").exists()):
        meta = json.loads((d / "model.json").read_text())
        bodies = sorted(d.glob("0*.json"))
        with tempfile.TemporaryDirectory(prefix="agents-") as tmp:
            model = write_tool_caller(
                Path(tmp) / "m.gguf", call=meta["call"], answer=meta["answer"], n_ctx=meta["n_ctx"]
            )
            serve = ("--model", model, "--threads", str(args.threads), "--ctx", str(meta["n_ctx"]))
            with ServeProcess(*serve, "--data-dir", Path(tmp) / "data") as srv:
                rows += _replay(srv.url, bodies, "turnstile", d.name)
            with ServeProcess(*serve, "--data-dir", Path(tmp) / "data") as srv:  # restarted: the disk tier
                rows += _replay(srv.url, bodies[-1:], "turnstile, restarted", d.name)
            if args.llama_server:
                ram = 4096
                with LlamaServer(args.llama_server, model, n_ctx=meta["n_ctx"], threads=args.threads,
                                 cache_ram_mib=ram, request_timeout=3600) as ls:  # fmt: skip
                    rows += _replay(ls.url, bodies, "llama-server -np 1 --cache-ram", d.name)
    write("agents", rows, params={"recorded": args.recorded, "threads": args.threads}, out=args.out)
