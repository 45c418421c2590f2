"""Streaming a turn that offers tools, through the Runtime on a scripted backend speaking Qwen 2.5's real template
(Hermes `<tool_call>` syntax): the answer streams while it is generated (a gate holds generation until the test
has the first pieces), tool calls stream as `runtime.ToolCallDelta` pieces, and the pieces add up to the Reply
and to what the session stores (ids included). Over HTTP (the app through httpx's ASGI transport) the SSE chunks
are OpenAI's `delta.tool_calls`: the first chunk of a call with id, type, name and arguments "", then arguments
text, then finish_reason "tool_calls".

Until the format engine (branch toolsyn) gives `HermesFormat.parse_partial`, a small local reading stands in for
it (`partial_hermes`: calls appear when their block closes); with the engine the real one is used.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2 as httpx
import pytest

from runtime import Reply, Runtime, ToolCallDelta
from runtime.errors import ToolCallParseError
from runtime.serve.http import app as make_app
from runtime.tools import HermesFormat, Tool, ToolFormat
from sessions import MemoryStore
from tests.support.tool_backend import Pause, TemplateBackend, of_reply, parts

pytestmark = pytest.mark.anyio

QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@dataclass(frozen=True)
class _Call:
    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class _Partial:
    content: str
    calls: tuple[_Call, ...] = field(default=())


class _ShimHermes(HermesFormat):
    """HermesFormat with a stand-in `parse_partial` (only until the engine has its own)."""

    def parse_partial(self, text: str, tools: Sequence[Tool]) -> _Partial:
        opener = "<tool_call>"
        start = text.find(opener)
        if start < 0:
            held = next((n for n in range(len(opener) - 1, 0, -1) if text.endswith(opener[:n])), 0)
            head = text[: len(text) - held]
            return _Partial(head.rstrip())  # trailing space may still be stripped before a call
        calls: list[_Call] = []
        at = start
        while True:
            end = text.find("</tool_call>", at)
            if end < 0:
                break
            value = json.loads(text[at + len(opener) : end])
            arguments = json.dumps(value["arguments"], ensure_ascii=False)
            calls.append(_Call(len(calls), "", value["name"], arguments))
            at = text.find(opener, end)
            if at < 0:
                break
        return _Partial(text[:start].strip(), tuple(calls))


def hermes() -> ToolFormat:
    return HermesFormat() if hasattr(HermesFormat, "parse_partial") else _ShimHermes()


@asynccontextmanager
async def runtime_for(output: str, pause: Pause | None = None) -> AsyncIterator[tuple[Runtime, TemplateBackend]]:
    backend = TemplateBackend(QWEN25, lambda _prompt: output, tools=hermes())
    backend.pause = pause
    async with Runtime.serve(backend, MemoryStore()) as rt:
        yield rt, backend


@asynccontextmanager
async def streaming_until(rt: Runtime, text: str) -> AsyncIterator[list[Any]]:
    """Stream session "s"'s "What is 2+3?" with ADD offered into a list, given once the streamed text is `text`
    (within 30 s, while the generation may still be held); leaving waits for the stream's end."""
    got: list[Any] = []
    seen = anyio.Event()

    async def read() -> None:
        async for item in rt.stream("s", "What is 2+3?", tools=[ADD]):
            got.append(item)
            if "".join(p for p in got if isinstance(p, str)) == text:
                seen.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        with anyio.fail_after(30):
            await seen.wait()
        yield got


async def test_the_answer_streams_while_it_is_generated_when_tools_are_offered() -> None:
    pause = Pause(after=2)
    async with runtime_for("Two and three make five.", pause) as (rt, backend):
        async with streaming_until(rt, "Two and") as got:  # without streaming nothing comes while generation is held
            assert not any(isinstance(p, Reply) for p in got)
            pause.go()
        text, calls, reply = parts(got)
        assert (text, calls, reply.text, reply.finish_reason) == ("Two and three make five.", [], text, "stop")
        assert "<tools>" in backend.prompts[0] and '"name": "add"' in backend.prompts[0]  # the template's tools


async def test_a_call_streams_as_pieces_that_add_up_to_the_reply_and_the_session() -> None:
    pause = Pause(after=3)
    async with runtime_for("Let me add. " + CALL, pause) as (rt, _):
        async with streaming_until(rt, "Let me add.") as got:  # the text before the call came before the call
            pause.go()
        text, calls, reply = parts(got)
        assert reply.finish_reason == "tool_calls" and text == reply.text == "Let me add."
        assert calls == of_reply(reply)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("add", {"a": 2, "b": 3})]
        first_call = next(i for i, p in enumerate(got) if isinstance(p, ToolCallDelta))
        assert all(not isinstance(p, str) for p in got[first_call:-1])  # the text came first
        stored = (await rt.get_session("s")).messages[-1]
        assert [c.id for c in stored.tool_calls] == [calls[0]["id"]]


async def test_parallel_calls_stream_by_index() -> None:
    two = CALL + "\n" + CALL.replace('"a": 2', '"a": 7')
    async with runtime_for(two) as (rt, _):
        items = [x async for x in rt.stream("s", "Sums?", tools=[ADD])]
        text, calls, reply = parts(items)
        assert text == reply.text == ""
        assert calls == of_reply(reply) and [json.loads(c["arguments"])["a"] for c in calls] == [2, 7]
        assert len({c["id"] for c in calls}) == 2


async def test_a_malformed_call_streamed_is_a_typed_error_and_commits_nothing() -> None:
    async with runtime_for('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>') as (rt, _):
        with pytest.raises(ToolCallParseError):
            async for _ in rt.stream("s", "Sums?", tools=[ADD]):
                pass
        assert await rt.list_sessions() == []


async def test_sse_chunks_carry_openai_tool_call_deltas() -> None:
    async with runtime_for("Adding. " + CALL) as (rt, _):
        body = {"messages": [{"role": "user", "content": "2+3?"}], "tools": [ADD]}
        transport = httpx.ASGITransport(app=make_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            whole = (await c.post("/v1/chat/completions", json=body)).json()["choices"][0]
            r = await c.post("/v1/chat/completions", json={**body, "stream": True})
        events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
        deltas = [ch["delta"].get("tool_calls") for ch in chunks if ch["delta"].get("tool_calls")]
        assert all(len(d) == 1 for d in deltas)
        first, rest = deltas[0][0], [d[0] for d in deltas[1:]]
        call = whole["message"]["tool_calls"][0]
        assert first["id"].startswith("call_") and call["id"].startswith("call_")  # (two requests: two fresh ids)
        assert first == {
            "index": 0,
            "id": first["id"],
            "type": "function",
            "function": {"name": "add", "arguments": ""},
        }
        assert all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest)
        assert "".join(d["function"]["arguments"] for d in rest) == call["function"]["arguments"]
        assert "".join(ch["delta"].get("content") or "" for ch in chunks) == whole["message"]["content"] == "Adding."
        assert [ch["finish_reason"] for ch in chunks][-1] == whole["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("output", "choice", "text", "calls"),
    [
        ('{"response": "Two and three make five."}', "auto", "Two and three make five.", []),
        ('{"tool_call": {"name": "add", "arguments": {"a": 2, "b": 3}}}', "auto", "", [("add", {"a": 2, "b": 3})]),
        ('{"response": "Five."}', "none", "Five.", []),
    ],
)
async def test_the_generic_json_protocol_streams_its_unwrapped_answer_and_calls(
    output: str, choice: str, text: str, calls: list[tuple[str, dict[str, int]]]
) -> None:
    """A template without tool support (the generic format: the reply is JSON): the pieces are the answer inside
    `{"response": ...}` and the calls, never the JSON itself, and add up to the Reply."""
    from runtime.testing import ScriptedBackend

    async with Runtime.serve(ScriptedBackend(lambda _m: output), MemoryStore()) as rt:
        items = [x async for x in rt.stream("s", "2+3?", tools=[ADD], tool_choice=choice)]
        said, got, reply = parts(items)
        assert (said, reply.text) == (text, text)
        assert got == of_reply(reply) and [(c["name"], json.loads(c["arguments"])) for c in got] == calls
