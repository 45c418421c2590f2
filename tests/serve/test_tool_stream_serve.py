"""Streamed tool calls against a real `turnstile serve` process, with the official `openai` and `anthropic`
clients: SmolLM2 (the generic JSON protocol, the call forced by tool_choice) and a tiny model with Qwen 2.5's
template (Hermes `<tool_call>`, the arguments forced by an enum). On both APIs: the events in order, the
arguments in at least two pieces that add up to the final arguments (canonical JSON, whatever whitespace the
model wrote), and the clients' assembled response / message equal to the unstreamed one (ids aside)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from tests.support.process import ServeProcess

pytestmark = pytest.mark.slow

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ENUM = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}
ASK = "Weather in Paris?"


def runs(kinds: list[str]) -> list[str]:
    """The kinds with each run of equal ones collapsed to one."""
    return [k for k, _ in itertools.groupby(kinds)]


def without_ids(output: list[Any]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "call_id", "parsed_arguments")}
        for item in output
    ]


async def check_responses(url: str, schema: dict[str, Any]) -> str:
    """One forced call streamed on /v1/responses, checked against the unstreamed one; its arguments."""
    oai = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    tools: Any = [{"type": "function", "name": "get_weather", "description": "The weather", "parameters": schema}]
    req: dict[str, Any] = {"model": "m", "input": ASK, "tools": tools, "tool_choice": "required", "temperature": 0}
    whole: Any = await oai.responses.create(**req, max_output_tokens=64)
    async with oai.responses.stream(**req, max_output_tokens=64) as stream:
        events: list[Any] = [e async for e in stream]
        final: Any = await stream.get_final_response()
    assert runs([e.type for e in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = events[2].item
    assert (added.type, added.name, added.arguments) == ("function_call", "get_weather", "")
    assert added.status == "in_progress"
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) >= 2 and {(e.item_id, e.output_index) for e in deltas} == {(added.id, 0)}
    (call,) = final.output
    assert "".join(e.delta for e in deltas) == done.arguments == call.arguments == whole.output[0].arguments
    assert call.arguments == json.dumps(json.loads(call.arguments), ensure_ascii=False)  # canonical JSON
    assert (call.id, call.call_id, call.status) == (added.id, added.call_id, "completed")
    assert without_ids(final.output) == without_ids(whole.output)
    return str(call.arguments)


async def check_messages(url: str, schema: dict[str, Any]) -> None:
    """One forced call streamed on /v1/messages, checked against the unstreamed one."""
    claude = AsyncAnthropic(base_url=url, api_key="none", max_retries=0)
    req: dict[str, Any] = {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": ASK}],
        "tools": [{"name": "get_weather", "description": "The weather", "input_schema": schema}],
        "tool_choice": {"type": "any"},
        "extra_body": {"temperature": 0},
    }
    whole: Any = await claude.messages.create(**req)
    async with claude.messages.stream(**req) as s:
        events: list[Any] = [e async for e in s if e.type not in ("text", "thinking", "input_json", "signature")]
        final: Any = await s.get_final_message()
    kinds = [e.delta.type if e.type == "content_block_delta" else e.type for e in events]
    assert runs(kinds) == [
        "message_start",
        "content_block_start",
        "input_json_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    block = events[1].content_block
    assert (block.type, block.name, block.input) == ("tool_use", "get_weather", {})
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert len(pieces) >= 2 and json.loads("".join(pieces)) == whole.content[0].input
    assert "".join(pieces) == json.dumps(whole.content[0].input, ensure_ascii=False)
    assert final.stop_reason == whole.stop_reason == "tool_use"
    assert final.content[0].id == block.id
    body, streamed = whole.model_dump(), final.model_dump()
    for message in (body, streamed):  # ids apart, and the cache's split of the same prompt
        message.pop("id")
        message["content"][0].pop("id")
        u = message.pop("usage")
        message["tokens"] = (u["input_tokens"] + u["cache_read_input_tokens"], u["output_tokens"])
    assert streamed == body


async def test_smollm2_streams_calls_on_responses_and_messages(smollm2_path: Path) -> None:
    with ServeProcess("--model", smollm2_path, "--threads", "2", "--ctx", "2048") as srv:
        arguments = await check_responses(srv.url, PARAMS)
        assert list(json.loads(arguments)) == ["city"]
        await check_messages(srv.url, PARAMS)


async def test_qwen_template_streams_calls_on_responses_and_messages(qwen: Path) -> None:
    with ServeProcess("--model", qwen, "--threads", "1", "--ctx", "2048") as srv:
        arguments = await check_responses(srv.url, ENUM)
        assert json.loads(arguments)["city"] in ("Paris", "Rome")
        await check_messages(srv.url, ENUM)
