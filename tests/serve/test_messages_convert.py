"""The Messages API's conversion (runtime.serve.http.messages.convert) and event stream (anthropic_sse), without a
model: requests to Runtime.complete's messages and options, replies to Anthropic's message and events, and
the endpoints in-process on the scripted backend (sessions in the key's namespace, errors' shape)."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import msgspec
import pytest

from runtime import Runtime
from runtime.reasoning import Reasoning, by_name
from runtime.reply import Reply, Timings, Usage
from runtime.serve.http import app as make_app
from runtime.serve.http.errors import ApiError
from runtime.serve.http.messages.convert import MessagesRequest, from_request, message_body
from runtime.serve.http.messages.stream import MessageEvents
from runtime.testing import ScriptedBackend
from sessions import MemoryStore
from sessions.model import ToolCall

TOOL = {
    "name": "add",
    "description": "Add.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
}


def call(body: dict[str, Any], session: str | None = None) -> Any:
    return from_request(msgspec.json.decode(json.dumps(body).encode(), type=MessagesRequest), session)


def test_messages_and_options() -> None:
    c = call(
        {
            "max_tokens": 9,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "x"},
                        {"type": "redacted_thinking", "data": "zzz"},
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "and then?"},
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "2"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "is_error": True,
                            "content": [{"type": "text", "text": "boom"}],
                        },
                        {"type": "tool_result", "tool_use_id": "toolu_3", "is_error": True},
                    ],
                },
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "add"},
            "thinking": {"type": "enabled", "budget_tokens": 64},
            "stop_sequences": ["END"],
            "temperature": 0.5,
            "top_k": 3,
            "metadata": {"user_id": "u"},
            "output_config": {"effort": "low"},
        },
        "t@s",
    )
    assert c.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}],
            "reasoning_content": "hm",
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "2"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
        {"role": "tool", "tool_call_id": "toolu_3", "content": "Error"},
        {"role": "user", "content": "and then?"},
    ]
    assert c.kwargs == {
        "tools": [
            {"type": "function", "function": {"name": "add", "parameters": TOOL["input_schema"], "description": "Add."}}
        ],
        "tool_choice": "add",
        "reasoning": "on",
        "reasoning_budget": 64,
        "max_tokens": 9,
        "temperature": 0.5,
        "top_k": 3,
        "stop": ["END"],
    }
    assert (c.session_id, c.stream) == ("t@s", False)
    ask = {"max_tokens": 1, "messages": [{"role": "user", "content": "q"}]}
    for choice, want in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert call({**ask, "tools": [TOOL], "tool_choice": {"type": choice}}).kwargs["tool_choice"] == want
    assert call({**ask, "thinking": {"type": "disabled"}}).kwargs == {"reasoning": "off", "max_tokens": 1}
    assert call({**ask, "thinking": {"type": "adaptive"}}).kwargs == {"max_tokens": 1}
    schema = {"type": "object"}
    fmt = {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    assert call({**ask, **fmt}).kwargs["response_format"] == schema
    only_results = call(
        {**ask, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]}
    )
    assert only_results.messages == [{"role": "tool", "tool_call_id": "x", "content": ""}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": [{"role": "user", "content": "q"}]}, "max_tokens: Field required"),
        ({"max_tokens": 0}, "max_tokens: must be at least 1, not 0 (no cache pre-warming)"),
        ({"max_tokens": 1, "messages": []}, "messages must be a non-empty list"),
        (
            {
                "max_tokens": 1,
                "messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}],
            },
            "messages[0].content[0]: a assistant message cannot hold a 'tool_result' block",
        ),
        (
            {
                "max_tokens": 1,
                "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}],
            },
            "messages[0].content[0]: a user message cannot hold a 'tool_use' block",
        ),
        ({"max_tokens": 1, "tool_choice": {"type": "any"}}, "tool_choice 'any' needs tools"),
        (
            {"max_tokens": 1, "tools": [TOOL], "tool_choice": {"type": "tool"}},
            "tool_choice of type 'tool' needs the tool's name",
        ),
        (
            {"max_tokens": 1, "tools": [{**TOOL, "type": "web_search_20250305"}], "tool_choice": {"type": "any"}},
            "tool_choice 'any' needs tools the model is offered",
        ),
        ({"max_tokens": 1, "thinking": {"type": "enabled"}}, "thinking of type 'enabled' needs budget_tokens"),
    ],
)
def test_what_the_conversion_refuses(body: dict[str, Any], message: str) -> None:
    body.setdefault("messages", [{"role": "user", "content": "q"}])
    with pytest.raises(ApiError) as e:
        call(body)
    assert e.value.status == 400 and message in e.value.message


def reply(text: str = "", reasoning: str = "", calls: tuple[ToolCall, ...] = (), **kw: Any) -> Reply:
    return Reply(
        session_id="s",
        request_id=1,
        text=text,
        finish_reason="tool_calls" if calls else kw.pop("finish_reason", "stop"),
        usage=Usage(prompt_tokens=10, cached_tokens=4, prefilled_tokens=6, generated_tokens=3),
        cache_source="slot",
        timings=Timings(queued=0, cache=0, prefill=0, decode=0, first_token=None, total=0),
        revision=0,
        tool_calls=calls,
        reasoning=reasoning,
        **kw,
    )


def test_message_body() -> None:
    usage = {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 3}
    assert message_body(reply("hi", "hm"), id="msg_1", model="m") == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
    cut = message_body(reply("h", stop_sequence="X"), id="i", model="m")
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", "X")
    assert message_body(reply("h", finish_reason="length"), id="i", model="m")["stop_reason"] == "max_tokens"
    tool = message_body(reply(calls=(ToolCall("c1", "add", {"a": 1}),)), id="i", model="m")
    assert tool["content"] == [{"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1}}]
    assert tool["stop_reason"] == "tool_use"


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        if chunk:
            name_line, data_line = chunk.split("\n")
            data = json.loads(data_line.removeprefix("data: "))
            assert name_line == f"event: {data['type']}"
            out.append((data["type"], data))
    return out


def test_event_stream() -> None:
    w = MessageEvents("msg_1", "m")
    raw = w.start() + w.piece(Reasoning("hm")) + w.piece(Reasoning(" ok")) + w.piece("") + w.piece("hi")
    raw += w.end(reply("hi", "hm ok"))
    got = [(n, d.get("index"), d.get("delta", d.get("content_block"))) for n, d in events(raw)]
    assert got == [
        ("message_start", None, None),
        ("ping", None, None),
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "hm"}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": " ok"}),
        ("content_block_delta", 0, {"type": "signature_delta", "signature": ""}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, {"type": "text", "text": ""}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "hi"}),
        ("content_block_stop", 1, None),
        ("message_delta", None, {"stop_reason": "end_turn", "stop_sequence": None}),
        ("message_stop", None, None),
    ]
    assert events(raw)[-2][1]["usage"]["cache_read_input_tokens"] == 4
    w = MessageEvents("msg_2", "m")  # a reply no piece announced: its blocks come at the end
    raw = w.start() + w.end(reply("let me", calls=(ToolCall("c1", "add", {"a": 1}),)))
    got = [(n, d.get("index"), d.get("delta", d.get("content_block"))) for n, d in events(raw)][2:]
    assert got == [
        ("content_block_start", 0, {"type": "text", "text": ""}),
        ("content_block_delta", 0, {"type": "text_delta", "text": "let me"}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, {"type": "tool_use", "id": "c1", "name": "add", "input": {}}),
        ("content_block_delta", 1, {"type": "input_json_delta", "partial_json": '{"a": 1}'}),
        ("content_block_stop", 1, None),
        ("message_delta", None, {"stop_reason": "tool_use", "stop_sequence": None}),
        ("message_stop", None, None),
    ]
    err = events(MessageEvents.error(ApiError(429, "busy")))
    assert err == [("error", {"type": "error", "error": {"type": "rate_limit_error", "message": "busy"}})]


async def test_endpoints_in_process() -> None:
    store = MemoryStore()
    backend = ScriptedBackend(lambda _m: "<think> hm </think> hello", reasoning=by_name("think"))
    async with Runtime.serve(backend, store) as rt:
        transport = httpx.ASGITransport(app=make_app(rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            r = await c.post("/v1/messages", json=body, headers={"X-Session-Id": "s1"})
            assert r.status_code == 200
            assert r.json()["content"] == [
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": "hello"},
            ]
            assert [m.content for m in store.get("s1").messages] == ["hi", "hello"]
            counted = await c.post("/v1/messages/count_tokens", json=body)
            u = r.json()["usage"]
            assert counted.json() == {"input_tokens": u["input_tokens"] + u["cache_read_input_tokens"]}
            bad = await c.post("/v1/messages", json=body, headers={"X-Session-Id": "no spaces"})
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
            empty = await c.post("/v1/messages", content=b"")
            assert empty.status_code == 400 and empty.json()["type"] == "error"
            missing = await c.get("/v1/sessions/nope")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
            assert (await c.get("/v1/sessions")).json()["data"] == [{"id": "s1", "object": "session"}]
