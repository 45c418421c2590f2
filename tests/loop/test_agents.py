"""Agents that act, on the real SmolLM2 (greedy): tool calls over concurrent sessions, the agent loop,
and structured output that always parses."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, TypedDict

import msgspec
import pytest

from runtime import Reply, Runtime
from runtime.tools import Tool

pytestmark = pytest.mark.slow

GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 96}


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


async def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


TOOLS = [Tool.from_function(f) for f in (add, multiply, weather)]
QUESTIONS = [
    "What is 3 plus 4?",
    "What is the weather in Paris?",
    "Multiply 6 by 7.",
    "Say hello.",
    "What is 10 plus 32?",
]


def check(reply: Reply) -> None:
    """A valid tool call (a known tool, arguments valid by its schema) or a final answer."""
    if reply.finish_reason == "tool_calls":
        assert reply.tool_calls
        for call in reply.tool_calls:
            tool = next(t for t in TOOLS if t.name == call.name)
            tool.check_arguments(call.arguments)
    else:
        assert reply.finish_reason in ("stop", "length") and not reply.tool_calls


async def test_tool_turns_over_concurrent_sessions(smollm2_path: Path) -> None:
    async with Runtime.open(smollm2_path, n_ctx=4096, n_threads=2) as rt:

        async def session(i: int) -> list[Reply]:
            sid = f"agent{i}"
            replies: list[Reply] = []
            prompts: list[int] = []
            for q in QUESTIONS:  # 5 user turns, each answered (tool results go back too)
                r = await rt.chat(sid, q, tools=TOOLS, **GREEDY)
                check(r)
                replies.append(r)
                prompts.append(r.usage.prompt_tokens)
                if r.tool_calls:
                    results = {c.id: "ok" for c in r.tool_calls}
                    r2 = await rt.chat(sid, tool_results=results, tools=TOOLS, **GREEDY)
                    check(r2)
            return replies

        per_session = await asyncio.gather(*(session(i) for i in range(4)))
    turns = [r for replies in per_session for r in replies]
    assert len(turns) == 20
    assert sum(1 for r in turns if r.tool_calls) >= 8  # the model does use the tools
    for replies in per_session:
        # the tools are in the cached prefix: turn 2 reuses at least all of turn 1's prompt
        assert replies[1].usage.cached_tokens >= replies[0].usage.prompt_tokens


async def test_run_completes_a_calculator_task(smollm2_path: Path) -> None:
    async with Runtime.open(smollm2_path, n_ctx=4096, n_threads=2) as rt:
        reply = await rt.run("calc", "What is 12 times 7? Use the multiply tool.", tools=[add, multiply], **GREEDY)
        session = await rt.get_session("calc")
    assert not reply.tool_calls and reply.finish_reason == "stop"
    assert [(s.call.name, s.result) for s in reply.steps] == [("multiply", "84.0")]
    assert "84" in reply.text
    roles = [m.role for m in session.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert session.messages[1].tool_calls[0].name == "multiply"


class Person(msgspec.Struct):
    name: str
    age: int


@dataclasses.dataclass
class City:
    name: str
    country: str


class Vote(TypedDict):
    choice: str
    confident: bool


FORMATS: list[tuple[str, Any]] = [
    ("Describe Ada Lovelace.", Person),
    ("Name a city.", City),
    ("Vote for tea or coffee.", Vote),
    ('Answer with exactly this JSON object: {"ok": true}', "json"),
    (
        "List two colors.",
        {
            "type": "object",
            "properties": {"colors": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
            "required": ["colors"],
        },
    ),
]


async def test_structured_output_always_parses(smollm2_path: Path) -> None:
    async with Runtime.open(smollm2_path, n_ctx=4096, n_threads=2) as rt:
        for i, (prompt, fmt) in enumerate(FORMATS):
            r = await rt.chat(f"s{i}", prompt, response_format=fmt, temperature=0.0, max_tokens=200)
            assert r.finish_reason == "stop", r
            if isinstance(fmt, type):
                assert isinstance(r.parsed, dict if fmt is Vote else fmt)
            else:
                assert isinstance(r.parsed, dict)
            stored = (await rt.get_session(f"s{i}")).messages[-1].content
            assert stored == r.text and msgspec.json.decode(r.text) is not None
        cut = await rt.chat("cut", "Describe Ada Lovelace.", response_format=Person, temperature=0.0, max_tokens=3)
        assert cut.finish_reason == "length" and cut.parsed is None
