"""End to end over six real templates (Qwen3, Qwen3-Coder, Mistral Small 3.2, gpt-oss, DeepSeek V3.1, Llama 3.1):
the agent loop completes a two-step calculator task, streams, stores, and refuses bad input, in each family's
own syntax.

The backend is scripted (tests/support/tool_backend.py) but speaks the real template: every prompt is rendered by
`apply_template` with the vendored template, tools, calls and results included, and the script answers what
that prompt shows (it looks for the tool results in it), writing the family's raw output: reasoning, then the
call in the family's syntax. So the template rendering, the reasoning split, the tool parse, the grammar plan
and the session storage are what is under test. Over HTTP a real uvicorn server (`turnstile serve`'s
`serve()`) is driven by the official `openai` client, whose streaming helper must assemble the streamed tool
calls into the same message as the non-streamed reply.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from openai import AsyncOpenAI

from runtime import Runtime
from runtime.errors import BadInput, ToolCallParseError
from runtime.tools import template_uses_tools
from sessions import MemoryStore
from tests.support.tool_backend import TemplateBackend, collect, of_reply
from tests.support.uvicorn_server import uvicorn_server

pytestmark = pytest.mark.anyio


def add(a: int, b: int) -> str:
    """Add two integers."""
    return f"sum={a + b}"


def mul(a: int, b: int) -> str:
    """Multiply two integers."""
    return f"product={a * b}"


TASK = "What is (2 + 3) * 4? Use the tools."
STEPS = [("add", {"a": 2, "b": 3}, "sum=5"), ("mul", {"a": 5, "b": 4}, "product=20")]
ANSWER = "The answer is 20."
MISTRAL_IDS = ["aB3dE6gH9", "Zy8Xw7Vu6", "Qq1Ww2Ee3"]
THOUGHT = "Let me compute."

Write = Callable[[str, dict[str, Any], int], str]  # (tool, arguments, call number) -> the raw call text


def _args(a: dict[str, Any]) -> str:
    return json.dumps(a)


@dataclass(frozen=True)
class Family:
    """A template and how its model writes: a call, the final answer, and the reasoning before them."""

    template: str
    call: Write
    answer: Callable[[str], str] = lambda text: text
    think: Callable[[str], str] = lambda text: text  # the output before a call, with the reasoning (if any)
    reasoning: str = ""  # the reasoning the first reply is stored with


FAMILIES = {
    "qwen3": Family(
        "Qwen-Qwen3-0.6B.jinja",
        lambda n, a, _i: "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>",
        think=lambda call: f"<think>\n{THOUGHT}\n</think>\n\n" + call,
        reasoning=THOUGHT,
    ),
    "qwen3-coder": Family(
        "Qwen3-Coder.jinja",
        lambda n, a, _i: (
            f"<tool_call>\n<function={n}>\n"
            + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>"
        ),
    ),
    "mistral-small-3.2": Family(
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        lambda n, a, i: f"[TOOL_CALLS]{n}[CALL_ID]{MISTRAL_IDS[i]}[ARGS]{_args(a)}",
    ),
    "gpt-oss": Family(
        "openai-gpt-oss-120b.jinja",
        lambda n, a, _i: f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{_args(a)}",
        answer=lambda text: f"<|channel|>final<|message|>{text}",
        think=lambda call: f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant" + call,
        reasoning=THOUGHT,
    ),
    "deepseek-v3.1": Family(
        "deepseek-ai-DeepSeek-V3.1.jinja",
        lambda n, a, _i: (
            f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{_args(a)}"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
    ),
    "llama-3.1": Family(
        "meta-llama-Llama-3.1-8B-Instruct.jinja", lambda n, a, _i: json.dumps({"name": n, "parameters": a})
    ),
}


def calculator(family: Family) -> Callable[[str], str]:
    """The script: call add, then (its result in the prompt) mul, then (that result in it) answer."""

    def script(prompt: str) -> str:
        if "product=20" in prompt:
            return family.answer(ANSWER)
        i = 1 if "sum=5" in prompt else 0
        name, args, _ = STEPS[i]
        return family.think(family.call(name, args, i))

    return script


def backend_for(name: str, script: Callable[[str], str] | None = None) -> TemplateBackend:
    family = FAMILIES[name]
    write = script or calculator(family)
    holder: list[TemplateBackend] = []

    def model(prompt: str) -> str:
        fmt = holder[0].view.reasoning  # a generation prompt that opened the reasoning block: close it first
        return (THOUGHT + fmt.end if fmt is not None and fmt.opens_block(prompt) else "") + write(prompt)

    backend = TemplateBackend(family.template, model)
    holder.append(backend)
    return backend


@asynccontextmanager
async def runtime_for(
    name: str, script: Callable[[str], str] | None = None
) -> AsyncIterator[tuple[Runtime, TemplateBackend]]:
    backend = backend_for(name, script)
    async with Runtime.serve(backend, MemoryStore()) as rt:
        yield rt, backend


@pytest.mark.parametrize("name", FAMILIES)
async def test_the_agent_loop_completes_a_two_step_calculator_task(name: str) -> None:
    async with runtime_for(name) as (rt, backend):
        reply = await rt.run("s", TASK, tools=[add, mul])
        assert (reply.text, reply.finish_reason) == (ANSWER, "stop")
        assert [(s.call.name, s.call.arguments, s.result) for s in reply.steps] == STEPS
        prompts = backend.prompts
        assert len(prompts) == 3 and "sum=5" in prompts[1] and "product=20" in prompts[2]  # the template's results
        if template_uses_tools(backend.source):  # (DeepSeek V3.1's template renders calls, not the tools)
            assert "Add two integers." in prompts[0]  # the template rendered the tools itself
        session = await rt.get_session("s")
        roles = [m.role for m in session.messages]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        first, second = session.messages[1], session.messages[3]
        assert [(c.name, c.arguments) for c in first.tool_calls] == [STEPS[0][:2]]
        assert [(c.name, c.arguments) for c in second.tool_calls] == [STEPS[1][:2]]
        assert session.messages[2].tool_call_id == first.tool_calls[0].id
        assert session.messages[4].tool_call_id == second.tool_calls[0].id
        if name == "mistral-small-3.2":  # the model's own ids, as the template wants them back
            assert [first.tool_calls[0].id, second.tool_calls[0].id] == MISTRAL_IDS[:2]
        assert first.reasoning.strip() == FAMILIES[name].reasoning or FAMILIES[name].reasoning == ""


@pytest.mark.parametrize("name", FAMILIES)
async def test_export_and_import_keep_the_calls_and_results(name: str) -> None:
    async with runtime_for(name) as (rt, backend):
        await rt.run("s", TASK, tools=[add, mul])
        copy = await rt.import_(await rt.export("s"), new_id="copy")
        original = await rt.get_session("s")
        assert copy.messages == original.messages
        # the copy renders as the original: the next turn of either gets the same prompt
        await rt.chat("copy", "Thanks. And 20 + 1?", tools=[add, mul])
        await rt.chat("s", "Thanks. And 20 + 1?", tools=[add, mul])
        assert backend.prompts[-1] == backend.prompts[-2]


@pytest.mark.parametrize("name", FAMILIES)
async def test_a_streamed_tool_turn_adds_up_to_its_reply(name: str) -> None:
    async with runtime_for(name) as (rt, _):
        items = [x async for x in rt.stream("s", TASK, tools=[add, mul])]
        text, calls, reasoning, reply = collect(items)
        assert reply.finish_reason == "tool_calls" and text == reply.text
        assert calls == of_reply(reply)
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [STEPS[0][:2]]
        assert reasoning == reply.reasoning
        stored = (await rt.get_session("s")).messages[-1]
        assert [c.id for c in stored.tool_calls] == [c["id"] for c in calls]


def _bad(family: Family, call: str) -> Callable[[str], str]:
    return lambda _prompt: family.think(call)


@pytest.mark.parametrize("name", FAMILIES)
async def test_bad_calls_are_typed_errors_and_commit_nothing(name: str) -> None:
    family = FAMILIES[name]
    for output in (family.call("nope", {"a": 1}, 0), family.call("add", {"a": "two", "b": 3}, 0)):
        async with runtime_for(name, _bad(family, output)) as (rt, _):
            with pytest.raises(ToolCallParseError):
                await rt.chat("s", TASK, tools=[add, mul])
            assert await rt.list_sessions() == []


@pytest.mark.parametrize("name", FAMILIES)
async def test_a_result_for_an_unknown_call_id_is_refused(name: str) -> None:
    async with runtime_for(name) as (rt, _):
        reply = await rt.chat("s", TASK, tools=[add, mul])
        assert reply.tool_calls
        before = await rt.get_session("s")
        with pytest.raises(BadInput):
            await rt.chat("s", tool_results={"not-a-call": "1"}, tools=[add, mul])
        assert await rt.get_session("s") == before


ADD_SPEC = {
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


def served(name: str) -> AbstractAsyncContextManager[str]:
    """A real uvicorn server on a free loopback port, serving a Runtime on the family's scripted backend."""
    return uvicorn_server(lambda: Runtime.serve(backend_for(name), MemoryStore()))


@pytest.mark.parametrize("name", FAMILIES)
async def test_the_openai_streaming_helper_assembles_the_same_message(name: str) -> None:
    async with served(name) as url:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": TASK}]
        whole = (await client.chat.completions.create(model="m", messages=messages, tools=[ADD_SPEC])).choices[0]
        async with client.chat.completions.stream(model="m", messages=messages, tools=[ADD_SPEC]) as stream:
            async for _event in stream:
                pass
            final = (await stream.get_final_completion()).choices[0]
        await client.close()
    assert whole.finish_reason == final.finish_reason == "tool_calls"
    assert (final.message.content or "") == (whole.message.content or "")
    got = [(c.function.name, json.loads(c.function.arguments)) for c in final.message.tool_calls or []]
    want = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []]
    assert got == want == [STEPS[0][:2]]
    assert all(c.id and c.type == "function" for c in final.message.tool_calls or [])
