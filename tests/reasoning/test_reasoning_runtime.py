"""Reasoning through the Runtime on the scripted backend (a `<think>` model without a model): the reply and the
session keep reasoning apart from the answer, streams tell the two apart, history operations and export keep it,
the controls resolve runtime < session < request, bad values are typed errors that change nothing, and an
export written before the field existed still imports."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pytest

from runtime import Runtime
from runtime.api import reasoning_options
from runtime.errors import InvalidConfig, InvalidSampling
from runtime.reasoning import Reasoning, by_name
from runtime.testing import ScriptedBackend
from sessions import history
from tests.conftest import Scripted

pytestmark = pytest.mark.anyio


def thinker(messages: Sequence[dict[str, Any]]) -> str:
    return f"<think> about {messages[-1]['content']} </think> answer to {messages[-1]['content']}"


@pytest.fixture
def scripted_backend() -> Callable[[], ScriptedBackend]:
    return lambda: ScriptedBackend(thinker, reasoning=by_name("think"))


async def test_the_reply_and_the_session_keep_reasoning_apart_from_the_answer(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        reply = await rt.chat("a", "x")
        assert (reply.reasoning, reply.text) == ("about x", "answer to x")
        s = await rt.get_session("a")
        assert [(m.role, m.content, m.reasoning) for m in s.messages] == [
            ("user", "x", ""),
            ("assistant", "answer to x", "about x"),
        ]
        assert s.chat_messages()[-1] == {"role": "assistant", "content": "answer to x", "reasoning_content": "about x"}


async def test_stream_pieces_are_reasoning_then_plain_answer_text(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        items = [p async for p in rt.stream("a", "x y")]
        pieces = items[:-1]
        assert "".join(p for p in pieces if isinstance(p, Reasoning)) == "about x y"
        assert "".join(p for p in pieces if isinstance(p, str) and not isinstance(p, Reasoning)) == "answer to x y"
        kinds = [isinstance(p, Reasoning) for p in pieces]
        assert kinds == sorted(kinds, reverse=True)  # all reasoning first
        assert not any("think>" in p for p in pieces)
        assert items[-1].reasoning == "about x y" and items[-1].text == "answer to x y"  # type: ignore[union-attr]


async def test_history_operations_and_export_keep_reasoning(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        await rt.chat("a", "one")
        await rt.chat("a", "two")
        forked = await rt.fork("a", "b")
        assert [m.reasoning for m in forked.messages] == ["", "about one", "", "about two"]
        undone = await rt.undo("b")
        assert [m.reasoning for m in undone.messages] == ["", "about one"]
        reply = await rt.regenerate("a")
        assert reply.reasoning == "about two"
        exported = await rt.export("a")
        doc = msgspec.json.decode(exported)
        assert doc["messages"][1] == {
            "role": "assistant",
            "content": "answer to one",
            "created": doc["messages"][1]["created"],
            "reasoning_content": "about one",
        }
        assert "reasoning" not in doc["sampling"]  # inherited controls are left out: older documents' shape
        back = history.import_(exported, new_id="c")
        assert back.messages == (await rt.get_session("a")).messages
        edited = await rt.edit("a", 0, "uno")
        assert edited.reasoning == "about uno"


OLD_EXPORT = (  # written before reasoning existed (no reasoning_content, sampling without reasoning controls)
    '{"format":"turnstile.session/1","id":"old","messages":[{"role":"system","content":"be brief"},'
    '{"role":"user","content":"hi","created":1700000000.0},{"role":"assistant","content":"hello","created":1700000001.0}],'
    '"sampling":{"temperature":0.7,"top_k":40,"top_p":0.95,"min_p":0.05,"repeat_penalty":1.0,"repeat_last_n":64,'
    '"presence_penalty":0.0,"frequency_penalty":0.0,"seed":null,"max_tokens":null,"stop":[],"ignore_eos":false},'
    '"metadata":{},"created":1700000000.0,"updated":1700000001.0,"revision":2}'
)


async def test_an_export_written_before_reasoning_existed_still_imports(scripted: Scripted) -> None:
    s = history.import_(OLD_EXPORT)
    assert [(m.role, m.content, m.reasoning) for m in s.messages] == [("user", "hi", ""), ("assistant", "hello", "")]
    assert s.sampling.temperature == 0.7 and s.sampling.reasoning is None
    assert history.export(s) == history.export(history.import_(history.export(s)))
    async with scripted() as (rt, _):
        await rt.import_(OLD_EXPORT)
        reply = await rt.chat("old", "again")
        assert reply.reasoning == "about again"


async def test_controls_resolve_runtime_then_session_then_request(scripted: Scripted) -> None:
    async with scripted(reasoning=reasoning_options("off", chat_template_kwargs={"x": 1})) as (rt, backend):
        await rt.chat("a", "m")
        assert backend.template_kwargs == {"x": 1, "enable_thinking": False}
        await rt.create_session("b", reasoning="on", chat_template_kwargs={"y": 2})
        await rt.chat("b", "m")
        assert backend.template_kwargs == {"x": 1, "y": 2, "enable_thinking": True}
        await rt.chat("b", "m", chat_template_kwargs={"enable_thinking": False})  # a template variable wins
        assert backend.template_kwargs == {"x": 1, "enable_thinking": False}
    async with scripted() as (rt, backend):
        await rt.chat("a", "m")
        assert backend.template_kwargs is None  # auto and no variables: the incremental render, nothing passed


async def test_reasoning_format_none_keeps_the_reasoning_in_the_text(scripted: Scripted) -> None:
    async with scripted() as (rt, _):
        reply = await rt.chat("a", "x", reasoning_format="none")
        assert (reply.reasoning, reply.text) == ("", "<think> about x </think> answer to x")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("reasoning", "maybe"),
        ("reasoning", True),
        ("reasoning_budget", -1),
        ("reasoning_budget", 1.5),
        ("reasoning_budget", True),
        ("reasoning_budget_message", 3),
        ("chat_template_kwargs", {"not a name": 1}),
        ("chat_template_kwargs", {"x": {1, 2}}),
        ("chat_template_kwargs", "enable_thinking"),
        ("reasoning_format", "deepseek-legacy"),
    ],
)
async def test_bad_controls_are_typed_errors_and_change_nothing(scripted: Scripted, name: str, value: object) -> None:
    async with scripted() as (rt, _):
        await rt.chat("a", "m")
        before = await rt.export("a")
        with pytest.raises(InvalidSampling):
            await rt.chat("a", "n", **{name: value})
        with pytest.raises(InvalidSampling):
            await rt.create_session("z", **{name: value})
        assert await rt.export("a") == before and await rt.list_sessions() == ["a"]
    if name != "reasoning_format":
        with pytest.raises(InvalidConfig):
            reasoning_options(**{name: value})


async def test_runtime_open_refuses_bad_controls_before_loading_anything(tmp_path: Any) -> None:
    missing = tmp_path / "no-such-model.gguf"  # never opened: the check comes first
    with pytest.raises(InvalidConfig):
        async with Runtime.open(missing, reasoning="sometimes"):
            pass
    with pytest.raises(InvalidConfig):
        async with Runtime.open(missing, reasoning_budget=-5):
            pass
