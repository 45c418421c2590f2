"""Replay what real coding agents sent (recorded in tests/serve/test_clients.py's format under the ignored
`.cache/recorded/CLIENT/`: one JSON body a request, `NNNN-v1-responses.json`, `…-v1-messages.json` or
`…-v1-chat-completions.json`, and `model.json`, the scripted model they ran on) against `turnstile serve`
and llama-server `-np 1 --cache-ram`, per turn: prompt, cached and prefilled tokens, the turn's new tokens
(its prompt less the previous prompt and reply, in turnstile's run; llama-server's rows take the same count)
and, for each miss (prefilled more than new + 1), the first
differing token and its cause (which message of the rendered prompt changed: the previous reply re-rendered
unlike the tokens generated for it, reasoning dropped by the template, a moving `<system-reminder>`, the
billing line, …). turnstile runs every turn but the last, is restarted on the same data dir, and runs the
last one (the first turn after a restart: from the disk tier).

    python -m benchmarks agents [--recorded DIR] [--llama-server BIN]
    python -m benchmarks agents --record-codex BIN     # first record a longer Codex session (7 requests)
    python -m benchmarks agents --only codex-resume    # one recording
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx2 as httpx
import msgspec

from benchmarks._cli import check_binary, parser, progress, write
from runtime.serve.http.messages.convert import MessagesRequest, prompt_of
from runtime.serve.http.responses import convert as responses
from runtime.serve.http.responses.schema import ResponsesRequest
from tests.support.llama_server import LlamaServer
from tests.support.process import ServeProcess
from tests.support.scripted_bpe import write_recorded_caller
from tests.support.scripted_models import write_tool_caller

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / ".cache" / "recorded"
TURNS = {"/v1/responses", "/v1/messages", "/v1/chat/completions", "/responses", "/chat/completions"}


def _usage(path: str, body: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt tokens, cached tokens, output tokens) of a reply in its dialect's usage shape."""
    u = body.get("usage") or {}
    if path.endswith("responses"):
        cached = (u.get("input_tokens_details") or {}).get("cached_tokens", 0)
        return u["input_tokens"], cached, u.get("output_tokens", 0)
    if path.endswith("messages"):
        read = u.get("cache_read_input_tokens", 0)
        return u["input_tokens"] + read, read, u.get("output_tokens", 0)
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return u["prompt_tokens"], cached, u.get("completion_tokens", 0)


def route(p: Path) -> str:
    """The request path a recorded body was sent to (`0003-v1-chat-completions.json` -> /v1/chat/completions)."""
    return "/" + p.stem.split("-", 1)[1].replace("-", "/")


def chat_form(path: str, raw: bytes, *, normalize: bool = True) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """The chat-completions messages and tools a recorded request renders as (turnstile's own conversion)."""
    if path.endswith("responses"):
        turn = responses.parse(msgspec.json.decode(raw, type=ResponsesRequest))
        head = [{"role": "system", "content": turn.system}] if turn.system else []
        return head + turn.messages, turn.kwargs.get("tools")
    if path.endswith("messages"):
        messages, kw = prompt_of(msgspec.json.decode(raw, type=MessagesRequest), normalize=normalize)
        return messages, kw.get("tools")
    body = json.loads(raw)
    return body["messages"], body.get("tools")


class Renderer:
    """Rendered prompts as tokens, through a running turnstile's /apply-template and /tokenize."""

    def __init__(self, url: str) -> None:
        self.url = url

    def text(self, messages: list[dict[str, Any]], tools: list[Any] | None, *, gen: bool = True) -> str:
        body: dict[str, Any] = {"messages": messages, "add_generation_prompt": gen}
        if tools:
            body["tools"] = tools
        r = httpx.post(self.url + "/apply-template", json=body, timeout=600)
        r.raise_for_status()
        return str(r.json()["prompt"])

    def pieces(self, text: str) -> list[tuple[int, bytes]]:
        r = httpx.post(self.url + "/tokenize", json={"content": text, "with_pieces": True}, timeout=600)
        r.raise_for_status()
        out = []
        for t in r.json()["tokens"]:
            piece = t["piece"]
            out.append((int(t["id"]), piece.encode() if isinstance(piece, str) else bytes(piece)))
        return out


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _message_at(
    renderer: Renderer,
    turns: list[tuple[list[dict[str, Any]], list[Any] | None]],
    n: int,
    head: list[tuple[int, bytes]],
    in_reply: bool,
) -> int:
    """The index of the message of turn `n` holding the token after `head`: the previous reply (the first
    message after the previous turn's, clients only append) for a miss in the reply; else the first message
    that differs from the previous turn's; else the first whose rendered prefix reaches the token."""
    messages, tools = turns[n]
    previous = turns[n - 1][0]
    if in_reply:
        return min(len(previous), len(messages) - 1)
    differs = [i for i, (a, b) in enumerate(zip(previous, messages, strict=False)) if a != b]
    if differs:
        return differs[0]
    offset = sum(len(p) for _, p in head)  # in bytes
    for k in range(1, len(messages) + 1):
        if len(renderer.text(messages[:k], tools, gen=False).encode()) > offset:
            return k - 1
    return len(messages) - 1


def cause(
    renderer: Renderer,
    turns: list[tuple[list[dict[str, Any]], list[Any] | None]],
    n: int,
    cached: int,
    previous_prompt: int,
) -> dict[str, Any]:
    """Where and why turn `n`'s prompt (0-based) leaves what the slot held after turn n-1 (`previous_prompt`
    tokens and the reply) at token `cached` of the system's prompt: the message of the rendered prompt holding
    that token and the cause (module docstring). Located in turnstile's rendering of the two turns: past the
    previous prompt, at the same distance from its end; inside it, where the two renderings first differ."""
    messages, tools = turns[n]
    now = renderer.pieces(renderer.text(messages, tools))
    before = [t for t, _ in renderer.pieces(renderer.text(*turns[n - 1]))]
    changed = _lcp(before, [t for t, _ in now])
    in_reply = cached >= previous_prompt or changed >= len(before)
    at = len(before) + max(0, cached - previous_prompt) if in_reply else changed
    at = min(at, len(now) - 1)
    index = _message_at(renderer, turns, n, now[:at], in_reply)
    m = messages[index]
    content = m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
    if in_reply:
        why = "previous reply re-rendered unlike its generated tokens"
        if m.get("role") == "assistant" and m.get("tool_calls"):
            why += " (tool-call JSON re-serialized)"
        elif m.get("role") == "assistant":
            why += " (its text re-tokenized)"
    elif m.get("role") == "system" and "x-anthropic-billing-header" in (content or ""):
        why = "billing line"
    elif "<system-reminder>" in (content or ""):
        why = "moving <system-reminder>"
    elif m.get("role") == "assistant" and m.get("reasoning_content"):
        why = "reasoning dropped by the template"
    else:
        why = f"{m.get('role')} message rendered differently"
    piece = now[at][1].decode("utf-8", "replace")
    return {"at": at, "message": index, "role": m.get("role"), "piece": piece, "cause": why}


def _replay(
    url: str,
    bodies: list[Path],
    system: str,
    client: str,
    first: int = 1,
    previous: tuple[int, int] | None = None,
) -> tuple[list[dict[str, Any]], tuple[int, int] | None]:
    """Send the bodies in order; one row a turn (new: this prompt less the previous prompt and reply)."""
    rows = []
    for turn, p in enumerate(bodies, first):
        path = route(p)
        body = {**json.loads(p.read_bytes()), "stream": False}
        r = httpx.post(url + path, json=body, timeout=3600)
        r.raise_for_status()
        prompt, cached, output = _usage(path, r.json())
        new = prompt if previous is None else prompt - previous[0] - previous[1]
        rows.append({"client": client, "system": system, "turn": turn, "prompt": prompt, "cached": cached,
                     "prefilled": prompt - cached, "new": new, "miss": prompt - cached > new + 1})  # fmt: skip
        previous = (prompt, output)
        progress(f"{client} {system} turn {turn}: {prompt} prompt, {cached} cached, {new} new")
    return rows, previous


def _model(d: Path, meta: dict[str, Any], tmp: Path) -> Path:
    """The recording's model: a GGUF named by model.json (`gguf`, beside it or absolute), else the scripted
    tool caller it describes (`call`, `answer`, `second_call`, `n_ctx`)."""
    if "gguf" in meta:
        return d / str(meta["gguf"])
    if meta.get("tokenizer"):  # SmolLM2's BPE vocabulary (tests.support.scripted_bpe)
        return write_recorded_caller(tmp / "m.gguf", meta)
    return write_tool_caller(
        tmp / "m.gguf", call=meta["call"], answer=meta["answer"], second_call=meta.get("second_call"),
        n_ctx=meta["n_ctx"],
    )  # fmt: skip


def _explain(
    url: str, rows: list[dict[str, Any]], bodies: list[Path], prompts: dict[int, int], *, normalize: bool = True
) -> None:
    """The cause of each miss in `rows` (`prompts`: the system's prompt tokens by turn; `normalize`: whether
    the system applies turnstile's normalizations)."""
    renderer = Renderer(url)
    turns = [chat_form(route(p), p.read_bytes(), normalize=normalize) for p in bodies]
    for row in rows:
        if row["miss"] and row["turn"] > 1:
            row.update(cause(renderer, turns, row["turn"] - 1, row["cached"], prompts[row["turn"] - 1]))
            progress(f"  miss: {row['system']} turn {row['turn']} at token {row['at']}: {row['cause']}")


def main(argv: list[str]) -> None:
    ap = parser("agents", __doc__)
    ap.add_argument("--recorded", default=str(RECORDED), metavar="DIR")
    ap.add_argument("--llama-server", default=os.environ.get("TURNSTILE_LLAMA_SERVER"), metavar="BIN")
    ap.add_argument("--record-codex", default=None, metavar="BIN", help="first record DIR/codex-resume (7 requests)")
    ap.add_argument("--only", default=None, metavar="NAMES", help="these recordings only (comma-separated)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-ram", type=int, default=4096, metavar="MIB")
    ap.add_argument("--out", default=None, metavar="DIR")
    args = ap.parse_args(argv)
    check_binary(ap, args.llama_server)
    if args.record_codex:
        from benchmarks._agents_record import record_codex

        record_codex(Path(args.record_codex), Path(args.recorded) / "codex-resume", threads=args.threads)
    rows: list[dict[str, Any]] = []
    only = set(args.only.split(",")) if args.only else None
    for d in sorted(p for p in Path(args.recorded).iterdir() if (p / "model.json").exists()):
        if only is not None and d.name not in only:
            continue
        meta = json.loads((d / "model.json").read_text())
        bodies = [p for p in sorted(d.glob("0*.json")) if route(p).rstrip("/") in TURNS]  # not count_tokens …
        with tempfile.TemporaryDirectory(prefix="agents-") as tmp:
            model = _model(d, meta, Path(tmp))
            serve = ("--model", model, "--threads", str(args.threads), "--ctx", str(meta["n_ctx"]))
            data = ("--data-dir", Path(tmp) / "data")
            with ServeProcess(*serve, *data) as srv:
                ours, last = _replay(srv.url, bodies[:-1], "turnstile", d.name)
            with ServeProcess(*serve, *data) as srv:  # restarted: the last turn from the disk tier
                after, _ = _replay(srv.url, bodies[-1:], "turnstile, restarted", d.name, len(bodies), last)
                ours += after
                _explain(srv.url, ours, bodies, {r["turn"]: r["prompt"] for r in ours})
            rows += ours
            if args.llama_server:
                with LlamaServer(args.llama_server, model, n_ctx=meta["n_ctx"], threads=args.threads,
                                 cache_ram_mib=args.cache_ram, request_timeout=3600) as ls:  # fmt: skip
                    theirs, _ = _replay(ls.url, bodies, "llama-server -np 1 --cache-ram", d.name)
                new = {r["turn"]: r["new"] for r in ours}  # the turn's new tokens: the same on both sides
                for r in theirs:
                    r["new"] = new[r["turn"]] if r["turn"] > 1 else r["prompt"]
                    r["miss"] = r["prefilled"] > r["new"] + 1
                with ServeProcess(*serve) as srv:  # the causes, from the same template and tokenizer
                    _explain(srv.url, theirs, bodies, {r["turn"]: r["prompt"] for r in theirs}, normalize=False)
                rows += theirs
    write("agents", rows, params={"recorded": args.recorded, "threads": args.threads}, out=args.out)
