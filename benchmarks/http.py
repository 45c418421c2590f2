"""`python -m benchmarks http`: what the HTTP API costs per request, and 64 concurrent streaming clients.

Overhead: the same stateless requests (the interleaved workload's first messages, `max_tokens` 8) made one
after another, (1) in-process with `await rt.complete(...)` and (2) over HTTP to `turnstile serve` on
loopback, non-streamed and streamed. Both sides run the scripted backend (no model; `--model PATH` runs a
GGUF model on both sides instead), so the difference of the medians is the HTTP layer. Three clients:
`raw` (a minimal keep-alive HTTP/1.1 client: the server's own overhead, JSON, the ASGI app, uvicorn and
loopback), `httpx` and the official `openai` client (what those libraries add on the client side).

Concurrency: `--clients` (64) clients stream `--per-client` requests each at once; errors must be 0.

    python -m benchmarks http [--requests 400] [--clients 64] [--per-client 4] [--model PATH] [--out DIR]
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx

from benchmarks import _cli, _rows
from runtime import Runtime
from runtime.testing import ScriptedBackend
from sessions import MemoryStore
from tests.support import workloads
from tests.support.process import ServeProcess

COLUMNS = ["mode", "client", "requests", "errors", "p50_ms", "p90_ms", "overhead_ms", "req_s"]
MAX_TOKENS = 8


def _requests(n: int) -> list[list[dict[str, str]]]:
    return [workloads.messages(i % len(workloads.PERSONAS), 0, {}) for i in range(n)]


def _row(mode: str, client: str, times: list[float], errors: int = 0, wall: float | None = None) -> dict[str, Any]:
    wall = sum(times) if wall is None else wall
    return {
        "mode": mode,
        "client": client,
        "requests": len(times),
        "errors": errors,
        "p50_ms": round(1000 * statistics.median(times), 3) if times else 0.0,
        "p90_ms": round(1000 * _rows.percentile(times, 90), 3) if times else 0.0,
        "overhead_ms": "-",
        "req_s": round(len(times) / wall, 1) if wall else 0.0,
    }


async def _timed(calls: list[Callable[[], Awaitable[None]]]) -> list[float]:
    times: list[float] = []
    for call in calls:
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return times


async def _in_process(model: Path | None, reqs: list[list[dict[str, str]]]) -> list[dict[str, Any]]:
    sampling = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0}

    async def run(rt: Runtime) -> list[dict[str, Any]]:
        await rt.complete(reqs[0], **sampling)  # warm up
        plain = await _timed([lambda m=m: _complete(rt, m, sampling) for m in reqs])  # type: ignore[misc]
        streamed = await _timed([lambda m=m: _stream(rt, m, sampling) for m in reqs])  # type: ignore[misc]
        return [_row("complete", "in-process", plain), _row("stream", "in-process", streamed)]

    if model is None:
        async with Runtime.serve(ScriptedBackend(), MemoryStore()) as rt:
            return await run(rt)
    async with Runtime.open(model, n_ctx=2048, n_threads=2, n_threads_batch=2) as rt:
        return await run(rt)


async def _complete(rt: Runtime, msgs: list[dict[str, str]], sampling: dict[str, Any]) -> None:
    await rt.complete(msgs, **sampling)


async def _stream(rt: Runtime, msgs: list[dict[str, str]], sampling: dict[str, Any]) -> None:
    async for _ in rt.complete_stream(msgs, **sampling):
        pass


def _body(msgs: list[dict[str, str]], stream: bool) -> bytes:
    return json.dumps(
        {"model": "m", "messages": msgs, "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 0, "stream": stream}
    ).encode()


class RawClient:
    """A minimal HTTP/1.1 keep-alive client (one connection, Content-Length or chunked replies): what is
    left of a request's time when the client library costs next to nothing."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//")[1].rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.stream: Any = None
        self.buf = b""

    async def __aenter__(self) -> RawClient:
        self.stream = await anyio.connect_tcp(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stream.aclose()

    async def _until(self, mark: bytes) -> bytes:
        while mark not in self.buf:
            self.buf += await self.stream.receive()
        head, _, self.buf = self.buf.partition(mark)
        return head

    async def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.buf += await self.stream.receive()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
        await self.stream.send(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        lines = (await self._until(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        if b"content-length" in headers:
            return status, await self._exactly(int(headers[b"content-length"]))
        out = b""
        while True:  # chunked
            size = int(await self._until(b"\r\n"), 16)
            chunk = await self._exactly(size + 2)
            if size == 0:
                return status, out
            out += chunk[:-2]


async def _over_http(url: str, reqs: list[list[dict[str, str]]]) -> list[dict[str, Any]]:
    from openai import AsyncOpenAI

    headers = {"content-type": "application/json"}
    rows: list[dict[str, Any]] = []
    async with RawClient(url) as raw:

        async def raw_call(msgs: list[dict[str, str]], stream: bool) -> None:
            status, body = await raw.post("/v1/chat/completions", _body(msgs, stream))
            if status != 200 or (stream and not body.endswith(b"data: [DONE]\n\n")):
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")

        await raw_call(reqs[0], False)
        for stream in (False, True):
            times = await _timed([lambda m=m, s=stream: raw_call(m, s) for m in reqs])  # type: ignore[misc]
            rows.append(_row("stream" if stream else "complete", "raw", times))
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:

        async def plain(msgs: list[dict[str, str]]) -> None:
            r = await c.post("/v1/chat/completions", content=_body(msgs, False), headers=headers)
            r.raise_for_status()
            r.json()

        async def streamed(msgs: list[dict[str, str]]) -> None:
            async with c.stream("POST", "/v1/chat/completions", content=_body(msgs, True), headers=headers) as r:
                r.raise_for_status()
                async for _ in r.aiter_lines():
                    pass

        await plain(reqs[0])
        rows.append(_row("complete", "httpx", await _timed([lambda m=m: plain(m) for m in reqs])))  # type: ignore[misc]
        rows.append(_row("stream", "httpx", await _timed([lambda m=m: streamed(m) for m in reqs])))  # type: ignore[misc]
    oai = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    async def openai_plain(msgs: list[dict[str, str]]) -> None:
        await oai.chat.completions.create(model="m", messages=msgs, max_tokens=MAX_TOKENS, temperature=0, seed=0)  # type: ignore[arg-type]

    await openai_plain(reqs[0])
    rows.append(_row("complete", "openai", await _timed([lambda m=m: openai_plain(m) for m in reqs])))  # type: ignore[misc]
    await oai.close()
    return rows


async def _concurrent(url: str, clients: int, per_client: int) -> dict[str, Any]:
    times: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as c:

        async def one(i: int) -> None:
            nonlocal errors
            for k in range(per_client):
                msgs = workloads.messages((i + k) % len(workloads.PERSONAS), 0, {})
                t0 = time.perf_counter()
                try:
                    async with c.stream("POST", "/v1/chat/completions", content=_body(msgs, True)) as r:
                        lines = [line async for line in r.aiter_lines() if line]
                    if r.status_code != 200 or lines[-1] != "data: [DONE]":
                        errors += 1
                except httpx.HTTPError:
                    errors += 1
                times.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(clients):
                tg.start_soon(one, i)
        wall = time.perf_counter() - t0
    return _row("stream", f"{clients} concurrent", times, errors, wall)


def main(argv: list[str]) -> None:
    ap = _cli.parser("http", __doc__)
    ap.add_argument("--requests", type=int, default=400, help="sequential requests per mode")
    ap.add_argument("--clients", type=int, default=64, help="concurrent streaming clients")
    ap.add_argument("--per-client", type=int, default=4, help="streamed requests per concurrent client")
    ap.add_argument("--model", default=None, help="a GGUF model on both sides (default: the scripted backend)")
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write http.json")
    args = ap.parse_args(argv)
    model = Path(args.model) if args.model else None
    reqs = _requests(args.requests)
    _cli.progress(f"in-process: {len(reqs)} requests x 2 modes")
    rows = anyio.run(_in_process, model, reqs)
    server_args = ["--scripted"] if model is None else ["--model", str(model), "--ctx", "2048", "--threads", "2"]
    with ServeProcess(*server_args) as srv:
        _cli.progress(f"over HTTP ({srv.url}): {len(reqs)} requests x 3")
        rows += anyio.run(_over_http, srv.url, reqs)
        _cli.progress(f"{args.clients} concurrent streaming clients x {args.per_client}")
        rows.append(anyio.run(_concurrent, srv.url, args.clients, args.per_client))
    base = {r["mode"]: r["p50_ms"] for r in rows if r["client"] == "in-process"}
    for r in rows:
        if r["client"] in ("raw", "httpx", "openai"):
            r["overhead_ms"] = round(r["p50_ms"] - base[r["mode"]], 3)
    _cli.write(
        "http",
        rows,
        params={
            "backend": model.name if model else "scripted",
            "requests": len(reqs),
            "max_tokens": MAX_TOKENS,
            "clients": args.clients,
            "per_client": args.per_client,
        },
        out=args.out,
        columns=COLUMNS,
    )
