"""/v1/chat/completions with a thinking model (the scripted backend writing `<think>` blocks): reasoning_content
in replies and stream deltas, reasoning_format none, reasoning_effort none, chat_template_kwargs, reasoning_content
on history messages handed to the template, and 400 for unknown or wrongly typed values."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.reasoning import by_name
from runtime.serve.http import app as make_app
from runtime.testing import ScriptedBackend
from tests.conftest import Scripted

pytestmark = pytest.mark.anyio

HI = [{"role": "user", "content": "hi"}]
SEEN: list[list[dict[str, Any]]] = []


def thinker(messages: Sequence[dict[str, Any]]) -> str:
    SEEN.append([dict(m) for m in messages])
    return "<think> pondering </think> hello there"


@pytest.fixture
def scripted_backend() -> Callable[[], ScriptedBackend]:
    return lambda: ScriptedBackend(thinker, reasoning=by_name("think"))


async def post(rt: Runtime, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=make_app(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        return await c.post("/v1/chat/completions", json=body)


async def test_the_reply_carries_reasoning_content_apart_from_the_content(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        r = await post(rt, {"messages": HI})
        assert r.status_code == 200
        message = r.json()["choices"][0]["message"]
        assert message == {
            "role": "assistant",
            "content": "hello there",
            "tool_calls": None,
            "reasoning_content": "pondering",
        }


async def test_stream_deltas_carry_reasoning_content_then_content(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        r = await post(rt, {"messages": HI, "stream": True})
        chunks = [json.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n") if e and e != "data: [DONE]"]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert deltas[0]["role"] == "assistant"
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "pondering"
        assert "".join(d.get("content", "") for d in deltas) == "hello there"
        assert not any("reasoning_content" in d and "content" in d for d in deltas)


async def test_reasoning_format_none_keeps_it_in_the_content(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        r = await post(rt, {"messages": HI, "reasoning_format": "none"})
        message = r.json()["choices"][0]["message"]
        assert message["content"] == "<think> pondering </think> hello there" and "reasoning_content" not in message
        for fmt in ("auto", "deepseek"):
            split = (await post(rt, {"messages": HI, "reasoning_format": fmt})).json()["choices"][0]["message"]
            assert (split["content"], split["reasoning_content"]) == ("hello there", "pondering")


async def test_reasoning_effort_and_chat_template_kwargs_reach_the_template(scripted: Scripted) -> None:
    async with scripted() as (rt, backend):
        await post(rt, {"messages": HI, "reasoning_effort": "none"})
        assert backend.template_kwargs == {"enable_thinking": False}
        await post(rt, {"messages": HI, "reasoning_effort": "high", "chat_template_kwargs": {"x": [1]}})
        assert backend.template_kwargs == {"x": [1], "reasoning_effort": "high"}


async def test_budget_fields_reach_the_runtime(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    async with scripted() as (rt, _):
        complete = rt.complete

        async def spy(messages: Any, **kw: Any) -> Any:
            seen.append(kw)
            return await complete(messages, **kw)

        monkeypatch.setattr(rt, "complete", spy)
        await post(rt, {"messages": HI, "reasoning_budget_tokens": 8, "reasoning_budget_message": "ok"})
        await post(rt, {"messages": HI, "thinking_budget_tokens": 0})
        await post(rt, {"messages": HI, "reasoning_budget_tokens": -1})
    assert [(k.get("reasoning_budget"), k.get("reasoning_budget_message")) for k in seen] == [
        (8, "ok"),
        (0, None),
        (None, None),
    ]


async def test_reasoning_content_on_history_messages_goes_to_the_template(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        history = [
            *HI,
            {"role": "assistant", "content": "yo", "reasoning_content": "earlier"},
            {"role": "user", "content": "again"},
        ]
        r = await post(rt, {"messages": history})
        assert r.status_code == 200
        assert SEEN[-1][1] == {"role": "assistant", "content": "yo", "reasoning_content": "earlier"}


@pytest.mark.parametrize(
    "extra",
    [
        {"reasoning_format": "sideways"},
        {"reasoning_format": 1},
        {"chat_template_kwargs": "enable_thinking"},
        {"chat_template_kwargs": {"not a name": 1}},
        {"reasoning_effort": 3},
        {"reasoning_budget_tokens": -2},
        {"reasoning_budget_tokens": "ten"},
        {"reasoning_budget_message": 1},
        {"messages": [{"role": "user", "content": "x", "reasoning_content": "no"}]},
        {"messages": [{"role": "assistant", "content": "x", "reasoning_content": 5}, *HI]},
    ],
)
async def test_unknown_or_wrongly_typed_values_are_400(scripted: Scripted, extra: dict[str, Any]) -> None:
    async with scripted() as (rt, _):
        r = await post(rt, {"messages": HI, **extra})
        assert r.status_code == 400, r.text
        assert set(r.json()) == {"error"}
