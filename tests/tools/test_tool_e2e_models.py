"""Tool calls on real llama.cpp: tiny generated models with Qwen3's and Qwen3-Coder's real templates, their output
forced by the family's own tool grammar (`tool_choice` naming a tool whose arguments are each one `enum` value,
so the grammar leaves one call text, up to whitespace, in the family's syntax: Hermes JSON or XML parameters).
The agent loop runs the call and sends the result back through the template; the streamed pieces of a forced
call add up to its Reply; the session keeps the call and the result across export and import.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import Runtime
from runtime.tools import Tool
from tests.support.reasoning_models import vendored_template, write_thinking
from tests.support.tool_backend import collect, of_reply

pytestmark = pytest.mark.anyio

TEMPLATES = {"qwen3": "Qwen-Qwen3-0.6B.jinja", "qwen3-coder": "Qwen3-Coder.jinja"}


def add(a: int, b: int) -> str:
    return f"sum={a + b}"


ADD = Tool(
    "add",
    "Add two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer", "enum": [2]}, "b": {"type": "integer", "enum": [3]}},
        "required": ["a", "b"],
    },
    function=add,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    d = tmp_path_factory.mktemp("tool-models")
    yield {name: write_thinking(d / f"{name}.gguf", vendored_template(t)) for name, t in TEMPLATES.items()}


def opened(path: Path) -> Runtime:
    # thinking off: the forced call comes at once (the reasoning block is closed by the generation prompt)
    return Runtime.open(path, n_ctx=2048, n_threads=1, reasoning="off")  # type: ignore[return-value]


async def test_the_agent_loop_runs_a_forced_call_and_sends_its_result_back_through_the_template(
    models: dict[str, Path],
) -> None:
    """(On Qwen3-Coder: the free answer of the tiny Qwen3 model after the result holds a stray `</tool_call>`
    token, which the Hermes parser refuses; the next test drives Qwen3 turn by turn.)"""
    async with opened(models["qwen3-coder"]) as rt:
        reply = await rt.run("s", "What is 2 + 3?", tools=[ADD], tool_choice="add", temperature=0, max_tokens=120)
        assert [(s.call.name, s.call.arguments, s.result) for s in reply.steps] == [("add", {"a": 2, "b": 3}, "sum=5")]
        session = await rt.get_session("s")
        assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
        call = session.messages[1].tool_calls[0]
        assert session.messages[2].tool_call_id == call.id and session.messages[2].content == "sum=5"
        prompt = rt.backend.engine.template.render_text(session.chat_messages())  # type: ignore[attr-defined]
        assert "sum=5" in prompt and "add" in prompt
        copy = await rt.import_(await rt.export("s"), new_id="copy")
        assert copy.messages == session.messages


@pytest.mark.parametrize("name", TEMPLATES)
async def test_a_forced_call_streams_as_pieces_that_add_up(models: dict[str, Path], name: str) -> None:
    async with opened(models[name]) as rt:
        items = [x async for x in rt.stream("s", "2 + 3?", tools=[ADD], tool_choice="add", temperature=0)]
        text, calls, _, reply = collect(items)
        assert reply.finish_reason == "tool_calls" and text == reply.text
        assert calls == of_reply(reply)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("add", {"a": 2, "b": 3})]
