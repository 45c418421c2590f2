"""Streamed tool calls on the Responses and Messages APIs, on the scripted backend (its reply is a fixed text,
streamed a word at a time, read by the generic JSON tool format), driven by the official `openai` and
`anthropic` clients: the event sequence, arguments in pieces that add up to the canonical JSON the
unstreamed reply has (the model's own whitespace and number spelling are not kept, on both paths), the
clients' assembled objects equal to the unstreamed ones, two calls in one reply, a reply cut inside a call,
a client that leaves mid-call (real uvicorn in-process): nothing stored, no session changed; and the
Agents SDK's streamed run calling a tool."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from runtime import Runtime
from runtime.backend.protocol import SlotRequest, SlotResult
from runtime.log import capture_logs
from runtime.reasoning import by_name
from runtime.serve.http import app as make_app
from runtime.serve.http.responses.store import ResponseStore
from runtime.serve.http.server import bind, serve
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

pytestmark = pytest.mark.anyio

# two calls, written with the model's own whitespace and number spelling (the JSON protocol's parallel form)
REPLY = (
    '<think>two tools</think>{"tool_calls": [{"name": "get_weather", "arguments": {"city":"Zürich" ,  '
    '"days": 3, "temp":  21.50}}, {"name": "get_time", "arguments": {"zone":  "CET"}}]}'
)
WEATHER = {"city": "Zürich", "days": 3, "temp": 21.5}
# the pieces of the first call's arguments as the words come (canonical JSON; "21.50" is 21.5 on both paths)
PIECES = ['{"city": "Zürich"', ', "days": ', "3", ', "temp": ', "21.5}"]
TIME = {"zone": "CET"}
PARAMS = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"}},
    },
    "get_time": {"type": "object", "properties": {"zone": {"type": "string"}}},
}
TOOLS: list[Any] = [{"type": "function", "name": n, "parameters": p} for n, p in PARAMS.items()]
ANTHROPIC_TOOLS: list[Any] = [{"name": n, "input_schema": p} for n, p in PARAMS.items()]
ASK: list[Any] = [{"role": "user", "content": "Weather and time?"}]


def canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)


@asynccontextmanager
async def clients(
    model: Callable[[Sequence[dict[str, Any]]], str] = lambda _m: REPLY,
) -> AsyncIterator[tuple[AsyncOpenAI, AsyncAnthropic, ResponseStore]]:
    store = ResponseStore(max_responses=8)
    async with Runtime.serve(ScriptedBackend(model, reasoning=by_name("think")), MemoryStore()) as rt:
        transport = httpx.ASGITransport(app=make_app(rt, responses=store))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as hc:
            yield (
                AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=hc, max_retries=0),
                AsyncAnthropic(base_url="http://t", api_key="x", http_client=hc, max_retries=0),
                store,
            )


def without_ids(output: list[Any]) -> list[dict[str, Any]]:
    """Output items without what two equal replies do not share (item ids, call ids)."""
    out = []
    for item in output:
        body = item if isinstance(item, dict) else item.model_dump(exclude_none=True)
        out.append({k: v for k, v in body.items() if k not in ("id", "call_id", "parsed_arguments")})
    return out


async def test_responses_stream_function_calls_piece_by_piece() -> None:
    seen: list[Sequence[dict[str, Any]]] = []

    def model(messages: Sequence[dict[str, Any]]) -> str:
        seen.append(messages)
        return REPLY

    async with clients(model) as (oai, _claude, store):
        whole: Any = await oai.responses.create(model="m", input="Weather and time?", tools=TOOLS)
        with capture_logs() as logs:
            async with oai.responses.stream(model="m", input="Weather and time?", tools=TOOLS) as stream:
                events: list[Any] = [e async for e in stream]
                final: Any = await stream.get_final_response()
        assert "responses.done" in [e["event"] for e in logs]  # the capture sees the server's events
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == []  # no piece dropped or contradicted
        call_events = [
            "response.output_item.added",
            *["response.function_call_arguments.delta"] * 5,
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            *["response.function_call_arguments.delta"] * 2,
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
        assert [e.type for e in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            *call_events,
            "response.completed",
        ]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        # every item event names the item the completed response lists at its output_index
        ids = [o.id for o in final.output]
        for e in events:
            if hasattr(e, "item_id"):
                assert ids[e.output_index] == e.item_id
            if e.type in ("response.output_item.added", "response.output_item.done"):
                assert ids[e.output_index] == e.item.id
        added = [e.item for e in events if e.type == "response.output_item.added"]
        assert [(a.type, getattr(a, "arguments", None), a.status) for a in added] == [
            ("reasoning", None, "in_progress"),
            ("function_call", "", "in_progress"),
            ("function_call", "", "in_progress"),
        ]
        for index, expected in ((1, WEATHER), (2, TIME)):
            deltas = [
                e.delta
                for e in events
                if e.type == "response.function_call_arguments.delta" and e.output_index == index
            ]
            (done,) = [
                e for e in events if e.type == "response.function_call_arguments.done" and e.output_index == index
            ]
            assert len(deltas) >= 2 and "".join(deltas) == done.arguments == canonical(expected)
            assert index == 2 or deltas == PIECES
        streamed_calls = [(o.name, o.arguments) for o in final.output if o.type == "function_call"]
        whole_calls = [(o.name, o.arguments) for o in whole.output if o.type == "function_call"]
        assert streamed_calls == whole_calls == [("get_weather", canonical(WEATHER)), ("get_time", canonical(TIME))]
        assert without_ids(final.output) == without_ids(whole.output)
        # the call ids the items were announced with are the final ones, and those stored
        assert [getattr(e.item, "call_id", None) for e in events if e.type == "response.output_item.added"][1:] == [
            o.call_id for o in final.output if o.type == "function_call"
        ]
        stored, unstreamed = (store.get("default", r.id).response["output"] for r in (final, whole))
        assert [o["id"] for o in stored] == ids and without_ids(stored) == without_ids(unstreamed)
        # the streamed response continues with its results: the session holds the calls under the streamed ids
        results: Any = [
            {"type": "function_call_output", "call_id": o.call_id, "output": "ok"}
            for o in final.output
            if o.type == "function_call"
        ]
        more = await oai.responses.create(model="m", input=results, previous_response_id=final.id, tools=TOOLS)
        assert more.status == "completed" and len(seen[-1]) == len(seen[0]) + 3  # the calls, two results
        call_ids = [r["call_id"] for r in results]
        # (the generic protocol shows the model its calls and their results as JSON, with the call ids)
        assert [c["id"] for c in json.loads(seen[-1][-3]["content"])["tool_calls"]] == call_ids
        assert [json.loads(m["content"])["tool_response"]["tool_call_id"] for m in seen[-1][-2:]] == call_ids


async def test_messages_stream_tool_use_blocks_piece_by_piece() -> None:
    async with clients() as (_oai, claude, _store):
        whole: Any = await claude.messages.create(model="m", max_tokens=200, messages=ASK, tools=ANTHROPIC_TOOLS)
        with capture_logs() as logs:
            async with claude.messages.stream(model="m", max_tokens=200, messages=ASK, tools=ANTHROPIC_TOOLS) as s:
                events: list[Any] = [e async for e in s]
                final: Any = await s.get_final_message()
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
        raw = [e for e in events if e.type in ("message_start", "content_block_start", "content_block_delta",
                                               "content_block_stop", "message_delta", "message_stop")]  # fmt: skip
        kinds = [e.type if e.type != "content_block_delta" else e.delta.type for e in raw]
        assert kinds == [
            "message_start",
            "content_block_start",
            "thinking_delta",
            "thinking_delta",
            "signature_delta",
            "content_block_stop",
            "content_block_start",
            *["input_json_delta"] * 5,
            "content_block_stop",
            "content_block_start",
            *["input_json_delta"] * 2,
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        starts = [e.content_block.model_dump(exclude_none=True) for e in raw if e.type == "content_block_start"]
        assert [(b["type"], b.get("name"), b.get("input")) for b in starts] == [
            ("thinking", None, None),
            ("tool_use", "get_weather", {}),
            ("tool_use", "get_time", {}),
        ]
        for index, expected in ((1, WEATHER), (2, TIME)):
            pieces = [e.delta.partial_json for e in raw if e.type == "content_block_delta" and e.index == index]
            assert len(pieces) >= 2 and "".join(pieces) == canonical(expected)
            assert index == 2 or pieces == PIECES
        assert final.stop_reason == whole.stop_reason == "tool_use"
        assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
            ("thinking", None),
            ("tool_use", WEATHER),
            ("tool_use", TIME),
        ]
        body, streamed = whole.model_dump(), final.model_dump()
        for message in (body, streamed):  # ids apart, and the cache's split of the same prompt
            message.pop("id")
            u = message.pop("usage")
            message["tokens"] = (u["input_tokens"] + u["cache_read_input_tokens"], u["output_tokens"])
            for block in message["content"]:
                block.pop("id", None)
        assert streamed == body


async def test_a_reply_cut_inside_a_call_ends_the_call_incomplete() -> None:
    async with clients() as (oai, claude, _store):
        cut: dict[str, Any] = {"model": "m", "input": "Weather?", "tools": TOOLS, "max_output_tokens": 7}
        whole: Any = await oai.responses.create(**cut)
        assert whole.status == "incomplete" and [o.type for o in whole.output] == ["reasoning", "message"]
        async with oai.responses.stream(**cut) as stream:
            events: list[Any] = [e async for e in stream]
        assert events[-1].type == "response.incomplete"
        final = events[-1].response
        # the call the stream announced is there, incomplete, with the arguments it got; the text the reply
        # ends with (the call's raw text, as unstreamed) follows as a message
        assert [(o.type, o.status) for o in final.output] == [
            ("reasoning", "completed"),
            ("function_call", "incomplete"),
            ("message", "completed"),
        ]
        assert final.output[1].arguments == '{"city": "Zürich"'
        assert final.output[2].content[0].text == whole.output[1].content[0].text
        kinds = [e.type for e in events]
        assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
        m: Any = await claude.messages.create(model="m", max_tokens=7, messages=ASK, tools=ANTHROPIC_TOOLS)
        async with claude.messages.stream(model="m", max_tokens=7, messages=ASK, tools=ANTHROPIC_TOOLS) as s:
            streamed: Any = await s.get_final_message()
        assert streamed.stop_reason == m.stop_reason == "max_tokens"
        assert [b.type for b in streamed.content] == ["thinking", "tool_use", "text"]
        assert streamed.content[1].input == {"city": "Zürich"}
        assert streamed.content[2].text == m.content[1].text


class HeldBackend(ScriptedBackend):
    """A scripted backend whose turns stop after their `after`-th piece until they are cancelled (the client
    left), so a test can leave in the middle of a call, deterministically."""

    def __init__(self, reply: Callable[[Sequence[dict[str, Any]]], str], after: int) -> None:
        super().__init__(reply, reasoning=by_name("think"))
        self.after = after
        self.held = threading.Event()

    def run(self, req: SlotRequest) -> SlotResult:
        sink, n = req.on_piece, 0

        def on_piece(piece: str) -> None:
            nonlocal n
            n += 1
            if sink is not None:
                sink(piece)
            if n == self.after:
                self.held.set()
                while not req.cancel():
                    threading.Event().wait(0.002)

        req.on_piece = on_piece
        return super().run(req)


@asynccontextmanager
async def served(backend: ScriptedBackend) -> AsyncIterator[tuple[str, Runtime, ResponseStore]]:
    """A real uvicorn server in this process over `backend` (a loopback port of its own)."""
    store, sessions = ResponseStore(max_responses=8), MemoryStore()
    ready = anyio.Event()
    url: list[str] = []
    rt_box: list[Runtime] = []

    @asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        async with Runtime.serve(backend, sessions) as rt:
            rt_box.append(rt)
            yield rt

    def on_ready(u: str) -> None:
        url.append(u)
        ready.set()

    sock = bind("127.0.0.1", 0)
    assert isinstance(sock, socket.socket)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve(open_runtime, sock=sock, on_ready=on_ready, responses=store))
        with anyio.fail_after(30):
            await ready.wait()
        try:
            yield url[0], rt_box[0], store
        finally:
            tg.cancel_scope.cancel()


async def disconnects(url: str) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(url + "/metrics")).text
    (line,) = [line for line in text.splitlines() if line.startswith("turnstile_client_disconnects_total ")]
    return float(line.rsplit(" ", 1)[1])


async def test_leaving_mid_call_stores_nothing() -> None:
    backend = HeldBackend(lambda _m: REPLY, after=6)  # held inside the first call's arguments
    async with served(backend) as (url, rt, store):
        oai = AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        stream = await oai.responses.create(model="m", input="Weather?", tools=TOOLS, stream=True, store=True)
        seen: list[str] = []
        async for event in stream:
            seen.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                break
        assert backend.held.is_set()
        await stream.close()  # the client leaves in the middle of the call
        with anyio.fail_after(30):
            while await disconnects(url) < 1:  # counted once the request has ended (and let go)
                pass
        assert seen[-2:] == ["response.output_item.added", "response.function_call_arguments.delta"]
        assert store.stats().responses == 0 and await rt.list_sessions() == []

        # a continuation left mid-call: the parent's session unchanged, and continued in place after
        backend.after = 0  # not held
        root: Any = await oai.responses.create(model="m", input="Weather?", tools=TOOLS)
        (conv,) = await rt.list_sessions()
        parent = await rt.get_session(conv)
        results: Any = [
            {"type": "function_call_output", "call_id": o.call_id, "output": "ok"}
            for o in root.output
            if o.type == "function_call"
        ]
        backend.after = 6
        stream = await oai.responses.create(
            model="m", input=results, previous_response_id=root.id, tools=TOOLS, stream=True
        )
        async for event in stream:
            if event.type == "response.function_call_arguments.delta":
                break
        await stream.close()
        with anyio.fail_after(30):
            while await disconnects(url) < 2:
                pass
        assert store.stats().responses == 1 and await rt.list_sessions() == [conv]
        kept = await rt.get_session(conv)
        assert (kept.revision, kept.messages) == (parent.revision, parent.messages)
        backend.after = 0
        await oai.responses.create(model="m", input=results, previous_response_id=root.id, tools=TOOLS)
        assert await rt.list_sessions() == [conv] and len((await rt.get_session(conv)).messages) == 5

        claude = AsyncAnthropic(base_url=url, api_key="x", max_retries=0, default_headers={"X-Session-Id": "s"})
        first = await claude.messages.create(model="m", max_tokens=200, messages=ASK, tools=ANTHROPIC_TOOLS)
        before = await rt.get_session("s")
        calls: list[Any] = [b for b in first.content if b.type == "tool_use"]
        backend.after = 6
        history: list[Any] = [
            *ASK,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in calls]},
        ]
        async with claude.messages.stream(model="m", max_tokens=200, messages=history, tools=ANTHROPIC_TOOLS) as s:
            async for ev in s:
                if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                    break
        with anyio.fail_after(30):
            while await disconnects(url) < 3:
                pass
        after = await rt.get_session(before.id)
        assert after.revision == before.revision and after.messages == before.messages


async def test_agents_sdk_streamed_run_calls_the_tool() -> None:
    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny"

    def model(messages: Sequence[dict[str, Any]]) -> str:
        if "tool_response" in str(messages[-1].get("content")):
            return '{"response": "It is sunny."}'
        return '{"tool_call": {"name": "get_weather", "arguments": {"city":  "Paris"}}}'

    async with clients(model) as (oai, _claude, _store):
        agent = Agent(name="w", model=OpenAIResponsesModel(model="m", openai_client=oai), tools=[get_weather])
        run = Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
        raw = [e.data.type async for e in run.stream_events() if e.type == "raw_response_event"]
    assert cities == ["Paris"] and run.final_output == "It is sunny."
    assert raw.count("response.function_call_arguments.delta") == 2 and raw.count("response.completed") == 2
    assert [item.type for item in run.new_items] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
