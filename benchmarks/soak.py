"""`python -m benchmarks soak`: many clients for minutes on one `turnstile serve`, dialects mixed, some of them
misbehaving; then checks that nothing leaked, nothing acknowledged was lost, and the server stayed flat.

`--clients` clients (each on one of `--keys` API keys) run for `--minutes`, each in a loop over its own
conversation: chat completions with an `X-Session-Id` session, chat completions resending the history
(stateless), Responses chains (`previous_response_id`) and Messages with a session, streamed every other
turn, with a tool offered on every third chat-session turn (a call is kept as text in the history). Between turns a
client sometimes misbehaves on a throwaway request: it leaves a stream after the first event, cancels a
request, times out, or sends a malformed body (a 400). Replies are greedy.

At the end every conversation is checked: a session holds exactly the turns its client was answered (none
lost, none extra), a chain's last response is still there, and each client's conversation replayed alone
(sequentially, on the same server, new ids) gives the same replies (no cross-talk). Reported: requests
per second, latency p50/p99 and time to first token (streamed turns), answers by status, the server's
RSS and open file descriptors at the start (after warm-up), middle and end, the data directory's bytes
against the disk limit, and the load average.

    python -m benchmarks soak [--minutes 10] [--clients 64] [--keys 4] [--model PATH | --scripted]
                              [--max-tokens 12] [--disk-limit MIB] [--out DIR]
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx

from benchmarks import _cli, _crosstalk, _rows
from benchmarks._crosstalk import Reply
from runtime.llama.models import default_model_path
from tests.support import workloads
from tests.support.process import ServeProcess

COLUMNS = ["what", "value"]
KINDS = ("chat-session", "chat-stateless", "responses", "messages")
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up in the ship's dictionary.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


@dataclass
class Client:
    """One client's conversation: what it sent and what it was answered (the acknowledged turns)."""

    index: int
    kind: str
    key: str
    system: str
    history: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-shaped, acknowledged turns only
    replies: list[str] = field(default_factory=list)
    checks: list[Reply] = field(default_factory=list)  # each acknowledged reply, for the token check
    turns: int = 0
    last_response: str | None = None

    @property
    def session(self) -> str:
        return f"soak-{self.index}"

    def prompt_messages(self, user: str) -> list[dict[str, Any]]:
        """The messages the server renders for this client's next turn: its system prompt (a Responses chain's
        `instructions` only on its first turn: they are not carried by `previous_response_id`), its
        acknowledged history and the new user message."""
        head = [] if self.kind == "responses" and self.turns else [{"role": "system", "content": self.system}]
        return [*head, *self.history, {"role": "user", "content": user}]

    def headers(self, session: str | None = None) -> dict[str, str]:
        h = {"Authorization": f"Bearer {self.key}"}
        return h | ({"X-Session-Id": session} if session else {})


@dataclass(frozen=True)
class Answer:
    text: str
    ids: list[int] | None  # the reply's token ids as the server reported them (None: the dialect has none)


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "kind status: message" of the turns refused


class Soak:
    def __init__(self, url: str, max_tokens: int, seed: int) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.tally = Tally()
        self.rng = random.Random(seed)

    # --- one turn of each kind (returns the reply text, or None when it was not acknowledged) ----------

    async def turn(self, c: httpx.AsyncClient, cl: Client, user: str, stream: bool, tools: bool) -> Answer | None:
        """One turn: the reply's text and the ids of its tokens as the server reported them (logprobs' `id`;
        None from Messages, which has no logprobs), or None when it was not acknowledged."""
        t0 = time.perf_counter()
        first: list[float] = []
        try:
            if cl.kind == "responses":
                text = await self._responses(c, cl, user, stream, tools, first)
            elif cl.kind == "messages":
                text = Answer(await self._messages(c, cl, user, stream, first), None)
            else:
                text = await self._chat(c, cl, user, stream, tools, first)
        except httpx.HTTPStatusError as e:
            self.tally.statuses[str(e.response.status_code)] += 1
            self.tally.errors[f"{cl.kind} {e.response.status_code}: {_error_text(e.response)}"] += 1
            return None
        except httpx.HTTPError as e:
            self.tally.statuses[type(e).__name__] += 1
            return None
        self.tally.statuses["200"] += 1
        self.tally.latencies.append(time.perf_counter() - t0)
        if first:
            self.tally.ttft.append(first[0] - t0)
        return text

    def _chat_body(self, cl: Client, user: str, stream: bool, tools: bool) -> dict[str, Any]:
        msgs = [{"role": "system", "content": cl.system}, *cl.history, {"role": "user", "content": user}]
        body: dict[str, Any] = {"messages": msgs, "max_tokens": self.max_tokens, "temperature": 0, "stream": stream}
        return body | ({"tools": [TOOL]} if tools else {})

    async def _chat(
        self, c: httpx.AsyncClient, cl: Client, user: str, stream: bool, tools: bool, first: list[float]
    ) -> Answer:
        ids: list[int] = []
        text = await self._chat_text(c, cl, user, stream, tools, first, ids)
        return Answer(text, ids)

    async def _chat_text(
        self,
        c: httpx.AsyncClient,
        cl: Client,
        user: str,
        stream: bool,
        tools: bool,
        first: list[float],
        ids: list[int],
    ) -> str:
        body = self._chat_body(cl, user, stream, tools)
        if not (tools and stream):  # (the server refuses logprobs on a streamed turn with tools)
            body |= {"logprobs": True, "top_logprobs": 0}
        headers = cl.headers(cl.session if cl.kind == "chat-session" else None)
        if not stream:
            r = await c.post("/v1/chat/completions", json=body, headers=headers)
            r.raise_for_status()
            choice = r.json()["choices"][0]
            ids += _ids((choice.get("logprobs") or {}).get("content"))
            return _chat_text(choice["message"])
        parts: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    delta = choice.get("delta", {})
                    if (delta.get("content") or delta.get("tool_calls")) and not first:
                        first.append(time.perf_counter())
                    parts.append(delta.get("content") or "")
                    ids += _ids((choice.get("logprobs") or {}).get("content"))
                    for tc in delta.get("tool_calls") or []:
                        call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                        fn = tc.get("function", {})
                        call["name"] += fn.get("name") or ""
                        call["arguments"] += fn.get("arguments") or ""
        text = "".join(parts)
        return text + "".join(f"<call {v['name']} {v['arguments']}>" for _, v in sorted(calls.items()))

    async def _responses(
        self, c: httpx.AsyncClient, cl: Client, user: str, stream: bool, tools: bool, first: list[float]
    ) -> Answer:
        body: dict[str, Any] = {"input": user, "max_output_tokens": self.max_tokens, "temperature": 0}
        body |= {"include": ["message.output_text.logprobs"], "top_logprobs": 0}
        body |= {"previous_response_id": cl.last_response} if cl.last_response else {"instructions": cl.system}
        if not stream:
            r = await c.post("/v1/responses", json=body, headers=cl.headers())
            r.raise_for_status()
            out = r.json()
            cl.last_response = out["id"]
            return _responses_answer(out)
        final: dict[str, Any] = {}
        async with c.stream("POST", "/v1/responses", json=body | {"stream": True}, headers=cl.headers()) as r:
            if r.status_code != 200:
                await r.aread()
                r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("type") == "response.output_text.delta" and not first:
                    first.append(time.perf_counter())
                if event.get("type") in ("response.completed", "response.incomplete"):
                    final = event["response"]
        if not final:
            raise httpx.RemoteProtocolError("the stream ended without a completed response")
        cl.last_response = final["id"]
        return _responses_answer(final)

    async def _messages(self, c: httpx.AsyncClient, cl: Client, user: str, stream: bool, first: list[float]) -> str:
        msgs = [*cl.history, {"role": "user", "content": user}]
        body = {"system": cl.system, "messages": msgs, "max_tokens": self.max_tokens, "temperature": 0}
        headers = cl.headers(cl.session)
        if not stream:
            r = await c.post("/v1/messages", json=body, headers=headers)
            r.raise_for_status()
            return "".join(b.get("text", "") for b in r.json()["content"] if b["type"] == "text")
        parts: list[str] = []
        async with c.stream("POST", "/v1/messages", json=body | {"stream": True}, headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta":
                    if not first:
                        first.append(time.perf_counter())
                    parts.append(event["delta"]["text"])
        return "".join(parts)

    # --- misbehaviour, on throwaway requests ----------------------------------------------------------

    async def fault(self, c: httpx.AsyncClient, cl: Client) -> None:
        kind = self.rng.choice(["disconnect", "cancel", "timeout", "malformed"])
        self.tally.faults[kind] += 1
        body = self._chat_body(cl, "Say something long about the sea.", kind == "disconnect", False)
        body["max_tokens"] = 4 * self.max_tokens
        headers = cl.headers(f"fault-{cl.index}-{self.tally.faults[kind]}")
        try:
            if kind == "disconnect":
                async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                    async for _ in r.aiter_lines():
                        break  # leave after the first event
            elif kind == "cancel":
                with anyio.move_on_after(self.rng.uniform(0.01, 0.3)):
                    await c.post("/v1/chat/completions", json=body, headers=headers)
            elif kind == "timeout":
                await c.post("/v1/chat/completions", json=body, headers=headers, timeout=0.05)
            else:
                r = await c.post("/v1/chat/completions", content=b'{"messages": [', headers=headers)
                self.tally.statuses[f"malformed->{r.status_code}"] += 1
        except httpx.HTTPError:
            pass

    # --- a client's life --------------------------------------------------------------------------------

    async def run_client(self, c: httpx.AsyncClient, cl: Client, deadline: float, fault_rate: float) -> None:
        while time.monotonic() < deadline:
            if self.rng.random() < fault_rate:
                await self.fault(c, cl)
                continue
            user = workloads.user_message(cl.index, cl.turns)
            tools = cl.kind == "chat-session" and cl.turns % 3 == 2
            prompt = cl.prompt_messages(user)
            answer = await self.turn(c, cl, user, stream=cl.turns % 2 == 1, tools=tools)
            if answer is None:
                await anyio.sleep(0.2)  # a 429 or a refused request: back off a little
                continue
            text = answer.text
            tokens = (answer.ids or None) if cl.kind != "messages" else None
            cl.checks.append(Reply(cl.index, cl.turns, cl.kind, prompt, [TOOL] if tools else None, text, tokens))
            cl.history += [{"role": "user", "content": user}, {"role": "assistant", "content": text}]
            cl.replies.append(text)
            cl.turns += 1


def _chat_text(msg: dict[str, Any]) -> str:
    calls = msg.get("tool_calls") or []
    return (msg.get("content") or "") + "".join(
        f"<call {tc['function']['name']} {tc['function']['arguments']}>" for tc in calls
    )


def _responses_answer(out: dict[str, Any]) -> Answer:
    parts = [
        part for item in out.get("output", []) if item.get("type") == "message" for part in item.get("content", [])
    ]
    ids = [i for part in parts for i in _ids(part.get("logprobs"))]
    return Answer("".join(part.get("text", "") for part in parts), ids)


def _error_text(r: httpx.Response) -> str:
    """A refused turn's error message (any dialect's shape), cut short."""
    try:
        err = r.json().get("error") or {}
    except (ValueError, AttributeError):
        return r.text[:80]
    return str(err.get("message", err) if isinstance(err, dict) else err)[:80]


def _ids(entries: list[dict[str, Any]] | None) -> list[int]:
    """The token ids of a logprobs list (llama-server's entries carry `id`)."""
    return [int(e["id"]) for e in entries or [] if "id" in e]


def _sample(pid: int, data_dir: Path) -> dict[str, int]:
    """RSS (and its anonymous / file-backed parts: heap vs mapped files such as the model and SQLite's mmap),
    open fds, and bytes on disk: the whole data dir, the disk tier's directory, of which SQLite's files."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        status = {k: v.split()[0] for k, _, v in (line.partition(":") for line in f) if k.startswith(("VmRSS", "Rss"))}
    fd_dir = f"/proc/{pid}/fd"
    fds = os.listdir(fd_dir)
    db_fds = 0  # SQLite files open (diskcache opens a connection per thread that touches a store)
    for fd in fds:
        with contextlib.suppress(OSError):
            db_fds += ".db" in os.readlink(f"{fd_dir}/{fd}")
    disk = states = sqlite = 0
    for p in data_dir.rglob("*"):
        with contextlib.suppress(OSError):  # a file the server removes meanwhile
            if p.is_file():
                n = p.stat().st_size
                disk += n
                if p.is_relative_to(data_dir / "states"):
                    states += n
                    sqlite += n if p.name.startswith("cache.db") else 0
    return {
        "rss_kib": int(status["VmRSS"]),
        "anon_kib": int(status.get("RssAnon", 0)),
        "file_kib": int(status.get("RssFile", 0)),
        "fds": len(fds),
        "db_fds": db_fds,
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "disk_bytes": disk,
        "states_bytes": states,
        "sqlite_bytes": sqlite,
    }


# the server's own counters of what it holds in memory, from /metrics (summed over their labels)
GAUGES = {
    'turnstile_state_stored_bytes{tier="ram"}': "ram_tier_bytes",
    "turnstile_stored_response_bytes": "response_bytes",
    "turnstile_stored_responses": "responses",
    "turnstile_sessions": "sessions",
}


async def _gauges(c: httpx.AsyncClient, key: str) -> dict[str, int]:
    try:
        r = await c.get("/metrics", headers={"Authorization": f"Bearer {key}"})
    except httpx.HTTPError:
        return {}
    out: dict[str, int] = {}
    for line in r.text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in GAUGES:
            out[GAUGES[name]] = int(float(value))
    return out


async def _sampler(
    pid: int, data_dir: Path, every: float, into: list[dict[str, int]], c: httpx.AsyncClient, key: str
) -> None:
    """Sample the server every `every` seconds while the load runs (the first right away)."""
    while True:
        into.append(_sample(pid, data_dir) | await _gauges(c, key) | {"t": round(time.monotonic())})
        await anyio.sleep(every)


async def _check_sessions(c: httpx.AsyncClient, clients: list[Client]) -> tuple[int, int]:
    """(lost or changed acknowledged turns, conversations checked) from the server's sessions and responses."""
    bad = checked = 0
    for cl in clients:
        if cl.kind in ("chat-session", "messages"):
            r = await c.get(f"/v1/sessions/{cl.session}", headers=cl.headers())
            held = r.json().get("messages", []) if r.status_code == 200 else []
            got = [(m["role"], m.get("content") or "") for m in held if m["role"] in ("user", "assistant")]
            want = [(m["role"], m["content"]) for m in cl.history]
            if cl.kind == "chat-session":  # tool calls are rendered into the text by the client; compare users
                got, want = [g for g in got if g[0] == "user"], [w for w in want if w[0] == "user"]
            if cl.turns and got != want:
                bad += 1
            checked += 1
        elif cl.kind == "responses" and cl.last_response is not None:
            r = await c.get(f"/v1/responses/{cl.last_response}", headers=cl.headers())
            bad += r.status_code != 200
            checked += 1
    return bad, checked


async def _replay(
    soak: Soak, c: httpx.AsyncClient, clients: list[Client], differ: list[dict[str, Any]], done: list[int]
) -> None:
    """Replay each conversation alone (each one finished goes to `done`); those that give other replies
    (cross-talk) go to `differ`, with the first turn that differs."""
    for n, cl in enumerate(clients):
        if n % 8 == 0:
            _cli.progress(f"replayed {n} of {len(clients)} conversations")
        if not cl.turns:
            continue
        alone = Client(cl.index + 100_000, cl.kind, cl.key, cl.system)
        alone_turns: list[str] = []
        for t, want in enumerate(cl.replies):
            user = workloads.user_message(cl.index, t)
            tools = cl.kind == "chat-session" and t % 3 == 2
            answer = await soak.turn(c, alone, user, stream=t % 2 == 1, tools=tools)
            if answer is None:
                break
            alone.history += [{"role": "user", "content": user}, {"role": "assistant", "content": want}]
            alone_turns.append(answer.text)
        if alone_turns != cl.replies:
            at = next((i for i, (a, b) in enumerate(zip(alone_turns, cl.replies, strict=False)) if a != b), None)
            differ.append(
                {
                    "client": cl.index,
                    "kind": cl.kind,
                    "turns": cl.turns,
                    "replayed": len(alone_turns),
                    "turn": at,
                    "load": cl.replies[at] if at is not None else None,
                    "alone": alone_turns[at] if at is not None else None,
                }
            )
        done.append(cl.index)


async def _run(args: Any, url: str, pid: int, data_dir: Path, keys: list[str]) -> list[dict[str, Any]]:
    soak = Soak(url, args.max_tokens, args.seed)
    clients = [
        Client(i, KINDS[i % len(KINDS)], keys[i % len(keys)], workloads.persona(i)[0]) for i in range(args.clients)
    ]
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients * 2)
    samples: dict[str, dict[str, int]] = {}
    series: list[dict[str, int]] = []  # every `--sample-every` seconds while the load runs
    differ: list[dict[str, Any]] = []
    done: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        warm = Client(10**6, "chat-stateless", keys[0], "warm up")
        for _ in range(2):
            await soak.turn(c, warm, "Hello.", stream=False, tools=False)
        soak.tally = Tally()
        t0 = time.monotonic()
        deadline = t0 + 60 * args.minutes
        async with anyio.create_task_group() as tg:
            tg.start_soon(_sampler, pid, data_dir, args.sample_every, series, c, keys[0])
            async with anyio.create_task_group() as load:
                for cl in clients:
                    load.start_soon(soak.run_client, c, cl, deadline, args.fault_rate)
            tg.cancel_scope.cancel()
        wall = time.monotonic() - t0
        # start: the first sample after the warm-up minute (or the first); middle: half-way; end: the last under load
        under = [x for x in series if x["t"] <= t0 + 60 * args.minutes] or series
        warm_t = t0 + min(60.0, 15 * args.minutes)
        samples["start"] = next((x for x in under if x["t"] >= warm_t), under[0])
        samples["middle"] = min(under, key=lambda x: abs(x["t"] - (t0 + 30 * args.minutes)))
        samples["end"] = under[-1]
        samples["after"] = _sample(pid, data_dir) | await _gauges(c, keys[0])
        tally, soak.tally = soak.tally, Tally()  # the replay's requests are not the load's
        lost, checked = await _check_sessions(c, clients)
        crosstalk = _token_check(args, clients)
        _cli.progress(f"replaying {sum(1 for cl in clients if cl.turns)} conversations alone")
        with anyio.move_on_after(60 * args.replay_minutes if args.replay_minutes else math.inf):
            await _replay(soak, c, clients, differ, done)
        replayed = sum(1 for cl in clients if cl.turns)  # (those cut off by --replay-minutes are not counted)
    lat, ttft = sorted(tally.latencies), sorted(tally.ttft)
    turns = sum(cl.turns for cl in clients)
    rows: list[dict[str, Any]] = [
        {"what": "acknowledged turns", "value": turns},
        {"what": "requests/s (acknowledged)", "value": round(len(lat) / wall, 2)},
        {"what": "latency p50 / p99 s", "value": f"{_p(lat, 50)} / {_p(lat, 99)}"},
        {"what": "TTFT p50 / p99 s (streamed)", "value": f"{_p(ttft, 50)} / {_p(ttft, 99)}"},
        {"what": "answers by status", "value": dict(sorted(tally.statuses.items()))},
        {"what": "faults injected", "value": dict(sorted(tally.faults.items()))},
        *(
            [{"what": "turns refused (kind status: message)", "value": dict(tally.errors.most_common(8))}]
            if tally.errors
            else []
        ),
        {"what": "5xx", "value": sum(n for s, n in tally.statuses.items() if s[:1] == "5")},
    ]
    for name in ("start", "middle", "end", "after"):
        s = samples[name]
        rows.append({"what": f"{name}: RSS MiB / fds / states MiB / data dir MiB", "value": _sample_text(s)})
    rows.append(
        {
            "what": "threads / SQLite fds: start, middle, end, after",
            "value": "; ".join(f"{samples[n]['threads']} / {samples[n]['db_fds']}" for n in samples),
        }
    )
    rows.append(
        {
            "what": "RAM tier MiB / stored responses (MiB) / sessions: start, middle, end, after",
            "value": "; ".join(_gauges_text(samples[n]) for n in samples),
        }
    )
    rows.append(
        {
            "what": "RSS anonymous / file-backed MiB: start, middle, end, after",
            "value": "; ".join(
                f"{samples[n]['anon_kib'] / 1024:.1f} / {samples[n]['file_kib'] / 1024:.1f}" for n in samples
            ),
        }
    )
    mid, end = samples["middle"], samples["end"]
    rows += [
        {"what": "RSS end vs middle", "value": f"{100 * (end['rss_kib'] - mid['rss_kib']) / mid['rss_kib']:+.1f} %"},
        {"what": "fds end vs middle", "value": f"{100 * (end['fds'] - mid['fds']) / mid['fds']:+.1f} %"},
        {
            "what": "RSS / fds max under load",
            "value": f"{max(x['rss_kib'] for x in series) / 1024:.1f} / {max(x['fds'] for x in series)}",
        },
        {
            "what": "states dir MiB max (records + SQLite) / disk limit MiB",
            "value": f"{max(x['states_bytes'] for x in series) / (1 << 20):.1f} / {args.disk_limit}",
        },
        {
            "what": "state records MiB max / SQLite files (cache.db, WAL) MiB max",
            "value": f"{max(x['states_bytes'] - x['sqlite_bytes'] for x in series) / (1 << 20):.1f} / "
            f"{max(x['sqlite_bytes'] for x in series) / (1 << 20):.1f}",
        },
        {"what": "conversations checked / lost or changed", "value": f"{checked} / {lost}"},
        {
            "what": "conversations replayed alone",
            "value": f"{len([i for i in done if clients[i].turns])} of {replayed}",
        },
        *({"what": f"cross-talk check: {k}", "value": v} for k, v in crosstalk.items()),
        {"what": "replay alone gives other text (information: rounding or a leak)", "value": len(differ)},
        *([{"what": "first differing replies", "value": differ}] if differ else []),
        {"what": "load average (1, 5, 15 min)", "value": " ".join(f"{x:.2f}" for x in os.getloadavg())},
    ]
    return rows


def _token_check(args: Any, clients: list[Client]) -> dict[str, Any]:
    """The per-token cross-talk check (`benchmarks._crosstalk`) over every acknowledged reply; {} when scripted."""
    if args.scripted:
        return {}
    replies = [r for cl in clients for r in cl.checks]
    _cli.progress(f"checking {len(replies)} replies token by token on a fresh context")
    checker = _crosstalk.Checker(args.model or default_model_path(), threads=args.threads)
    try:
        bound = 60 * args.check_minutes if args.check_minutes else math.inf
        return _crosstalk.check(checker, replies, args.delta, seconds=bound, progress=_cli.progress)
    finally:
        checker.close()


def _gauges_text(s: dict[str, int]) -> str:
    mib = 1 << 20
    if "ram_tier_bytes" not in s:
        return "-"
    return (
        f"{s['ram_tier_bytes'] / mib:.1f} / {s.get('responses', 0)} ({s.get('response_bytes', 0) / mib:.1f}) / "
        f"{s.get('sessions', 0)}"
    )


def _sample_text(s: dict[str, int]) -> str:
    mib = 1 << 20
    return f"{s['rss_kib'] / 1024:.1f} / {s['fds']} / {s['states_bytes'] / mib:.1f} / {s['disk_bytes'] / mib:.1f}"


def _p(values: list[float], q: float) -> str:
    return f"{_rows.percentile(values, q):.3f}" if values else "-"


def main(argv: list[str]) -> None:
    ap = _cli.parser("soak", __doc__)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--keys", type=int, default=4, help="API keys the clients share (client i uses key i mod K)")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--fault-rate", type=float, default=0.1, help="share of a client's steps that misbehave")
    ap.add_argument("--disk-limit", type=int, default=64, metavar="MIB")
    ap.add_argument("--cache-ram", type=int, default=32, metavar="MIB")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-every", type=float, default=10.0, metavar="S", help="seconds between RSS/fd samples")
    ap.add_argument("--replay-minutes", type=float, default=0, metavar="M", help="stop the replay after M (0: none)")
    ap.add_argument(
        "--delta",
        type=float,
        default=1.0,
        metavar="LOGITS",
        help="cross-talk: a reply token further than this below the highest logit (alone, teacher-forced)",
    )
    ap.add_argument(
        "--check-minutes", type=float, default=0, metavar="M", help="stop the cross-talk check after M (0: none)"
    )
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--scripted", action="store_true", help="no model (the server's scripted backend)")
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the server (e.g. glibc's MALLOC_MMAP_THRESHOLD_=1048576); repeatable",
    )
    ap.add_argument("--out", default=None, metavar="DIR", help="where to write soak.json")
    args = ap.parse_args(argv)
    keys = [f"sk-soak-{k}-{os.getpid()}" for k in range(args.keys)]
    with _cli.temp_dir("turnstile-soak-") as tmp:
        data_dir = Path(tmp) / "data"
        key_file = Path(tmp) / "keys"
        key_file.write_text("".join(f"k{i}: {key}\n" for i, key in enumerate(keys)))
        model = ["--scripted"] if args.scripted else (["--model", args.model] if args.model else [])
        server = [
            *model,
            "--data-dir",
            data_dir,
            "--api-key-file",
            key_file,
            "--threads",
            str(args.threads),
            "--ctx",
            "4096",
            "--disk-limit",
            str(args.disk_limit),
            "--cache-ram",
            str(args.cache_ram),
            "--policy",
            "affinity",
        ]
        env = dict(e.split("=", 1) for e in args.server_env)
        with ServeProcess(*server, env=env) as srv:
            _cli.progress(f"{args.clients} clients for {args.minutes} min on {srv.url}")
            rows = anyio.run(_run, args, srv.url, srv.pid, data_dir, keys)
    _cli.write(
        "soak",
        rows,
        params={
            "minutes": args.minutes,
            "clients": args.clients,
            "keys": args.keys,
            "max_tokens": args.max_tokens,
            "fault_rate": args.fault_rate,
            "backend": "scripted" if args.scripted else (args.model or "SmolLM2-135M-Instruct"),
            "server_env": args.server_env,
            "delta": args.delta,
        },
        out=args.out,
        columns=COLUMNS,
    )
