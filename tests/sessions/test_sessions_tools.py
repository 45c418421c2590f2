"""Tool calls and tool messages in sessions: validation, the OpenAI shape, export/import, history ops."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from sessions import InvalidHistoryOp, InvalidSession, Message, Session, history
from sessions.model import ToolCall, validate


def call(cid: str, name: str = "add", **args: Any) -> ToolCall:
    return ToolCall(cid, name, args)


def tool_session() -> Session:
    return Session(
        id="t",
        system="sys",
        messages=(
            Message("user", "what is 1+2 and 3+4?", 1.0),
            Message("assistant", "", 2.0, (call("c1", a=1, b=2), call("c2", a=3, b=4))),
            Message("tool", "3", 3.0, tool_call_id="c1"),
            Message("tool", "7", 3.0, tool_call_id="c2"),
            Message("assistant", "3 and 7", 4.0),
            Message("user", "and 5+5?", 5.0),
            Message("assistant", "let me see", 6.0, (call("c3", a=5, b=5),)),
            Message("tool", "10", 7.0, tool_call_id="c3"),
            Message("assistant", "10", 8.0),
        ),
        created=1.0,
        updated=8.0,
        revision=4,
    )


def test_tool_call_and_message_validation() -> None:
    bad_calls: list[tuple[Any, Any, Any]] = [
        ("", "add", {}),
        ("c 1", "add", {}),
        ("c1", "bad name", {}),
        ("c1", "x" * 65, {}),
        ("c1", "add", {"x": float("nan")}),
        ("c1", "add", {1: 2}),
        ("c1", "add", {"x": object()}),
    ]
    for cid, name, args in bad_calls:
        with pytest.raises(InvalidSession):
            ToolCall(cid, name, args)
    with pytest.raises(InvalidSession, match="tool_call_id"):
        Message("tool", "3")
    with pytest.raises(InvalidSession):
        Message("user", "x", 1.0, (call("c1"),))
    with pytest.raises(InvalidSession):
        Message("user", "x", 1.0, tool_call_id="c1")
    with pytest.raises(InvalidSession):
        Message("assistant", "x", 1.0, [call("c1")])  # type: ignore[arg-type]
    assert Message("tool", "3", 1.0, tool_call_id="c1").tool_calls == ()


def test_session_links_calls_and_results() -> None:
    s = tool_session()
    with pytest.raises(InvalidSession, match="used twice"):
        msgspec.structs.replace(s, messages=(*s.messages, Message("assistant", "", 9.0, (call("c1"),))))
    with pytest.raises(InvalidSession, match="no earlier call"):
        msgspec.structs.replace(s, messages=(*s.messages, Message("tool", "x", 9.0, tool_call_id="c9")))
    with pytest.raises(InvalidSession, match="answered twice"):
        msgspec.structs.replace(s, messages=(*s.messages, Message("tool", "x", 9.0, tool_call_id="c3")))
    early = (Message("tool", "x", 1.0, tool_call_id="c1"), *s.messages)
    with pytest.raises(InvalidSession):
        msgspec.structs.replace(s, messages=early)
    # arguments changed in place are caught by validate
    s.messages[1].tool_calls[0].arguments["x"] = float("inf")
    with pytest.raises(InvalidSession):
        validate(s)


def test_chat_messages_shape() -> None:
    msgs = tool_session().chat_messages()
    assert msgs[:5] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "what is 1+2 and 3+4?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}},
            ],
        },
        {"role": "tool", "content": "3", "tool_call_id": "c1"},
        {"role": "tool", "content": "7", "tool_call_id": "c2"},
    ]
    assert msgs[5] == {"role": "assistant", "content": "3 and 7"}


def test_export_shape_with_tools() -> None:
    doc = json.loads(history.export(tool_session()))
    assert doc["messages"][2] == {
        "role": "assistant",
        "content": "",
        "created": 2.0,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a":3,"b":4}'}},
        ],
    }
    assert doc["messages"][3] == {"role": "tool", "content": "3", "created": 3.0, "tool_call_id": "c1"}
    assert doc["messages"][5] == {"role": "assistant", "content": "3 and 7", "created": 4.0}


def test_export_import_round_trip_with_tools() -> None:
    s = tool_session()
    back = history.import_(history.export(s))
    assert back == s
    assert history.export(back) == history.export(s)


def test_import_openai_messages_with_tools() -> None:
    bare = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "x1", "type": "function", "function": {"name": "f", "arguments": '{"q": [1, 2]}'}}],
        },
        {"role": "tool", "tool_call_id": "x1", "content": "ok", "name": "f"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "x2", "type": "function", "function": {"name": "g", "arguments": {"k": "v"}}}],
        },
    ]
    s = history.import_(json.dumps(bare), new_id="b", now=5.0)
    assert s.messages == (
        Message("user", "hi", 5.0),
        Message("assistant", "", 5.0, (ToolCall("x1", "f", {"q": [1, 2]}),)),
        Message("tool", "ok", 5.0, tool_call_id="x1"),
        Message("assistant", "", 5.0, (ToolCall("x2", "g", {"k": "v"}),)),
    )


@pytest.mark.parametrize(
    "messages",
    [
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{"}}],
            }
        ],
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "[1]"}}],
            }
        ],
        [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "x", "function": {"name": "f"}}]}],
        [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {"name": "bad name"}}]}],
        [{"role": "tool", "content": "x", "tool_call_id": "nope"}],
        [{"role": "user", "content": None}],
        [{"role": "assistant", "content": None}],
        [{"role": "user", "content": "x", "tool_call_id": "a"}],
    ],
)
def test_import_refuses_bad_tool_messages(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(InvalidSession):
        history.import_(json.dumps(messages), new_id="x")


# An export written before tool calls existed, verbatim: it must still import.
OLD_EXPORT = (
    '{"format":"turnstile.session/1","id":"old","messages":[{"role":"system","content":"be brief"},'
    '{"role":"user","content":"hello","created":1700000000.5},'
    '{"role":"assistant","content":"hi there","created":1700000001.25}],'
    '"sampling":{"temperature":0.0,"top_k":40,"top_p":0.95,"min_p":0.05,"repeat_penalty":1.0,"repeat_last_n":64,'
    '"presence_penalty":0.0,"frequency_penalty":0.0,"seed":3,"max_tokens":null,"stop":[],"ignore_eos":false},'
    '"metadata":{"owner":"me"},"created":1700000000.0,"updated":1700000001.25,"revision":2}'
)


def test_old_export_still_imports() -> None:
    s = history.import_(OLD_EXPORT)
    assert s.messages == (Message("user", "hello", 1700000000.5), Message("assistant", "hi there", 1700000001.25))
    assert (s.id, s.system, s.revision, s.metadata) == ("old", "be brief", 2, {"owner": "me"})
    assert json.loads(history.export(s)) == json.loads(OLD_EXPORT)


class _OldMessage(msgspec.Struct, frozen=True):
    role: str
    content: str
    created: float


class _OldSession(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    system: str | None = None
    messages: tuple[_OldMessage, ...] = ()
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    created: float
    updated: float
    revision: int = 0


def test_records_stored_before_tool_calls_still_decode() -> None:
    old = _OldSession(
        id="o", messages=(_OldMessage("user", "u", 1.0), _OldMessage("assistant", "a", 2.0)), created=1.0, updated=2.0
    )
    s = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Session)
    assert s.messages == (Message("user", "u", 1.0), Message("assistant", "a", 2.0))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(tool_session()), type=Session) == tool_session()


def test_undo_fork_truncate_on_tool_turns() -> None:
    s = tool_session()
    assert history.undo(s).messages == s.messages[:5]
    assert history.undo(s, 2).messages == ()
    f = history.fork(s, "f", 3, now=9.0)
    assert f.messages == s.messages[:3]
    assert history.pending_calls(f) == (call("c2", a=3, b=4),)
    assert history.truncate(s, 2).messages == s.messages[:2]


def test_edit_on_tool_turns() -> None:
    s = tool_session()
    e = history.edit(s, 5, "and 6+6?", now=9.0)
    assert e.messages == (*s.messages[:5], Message("user", "and 6+6?", 9.0))
    with pytest.raises(InvalidHistoryOp, match="tool message"):
        history.edit(s, 2, "x")


def test_regenerate_base() -> None:
    s = tool_session()
    assert history.regenerate_base(s).messages == s.messages[:8]  # ends with the tool result
    calls_only = history.truncate(s, 7)
    assert history.regenerate_base(calls_only).messages == s.messages[:6]  # the call itself is redone
    assert history.regenerate_base(history.truncate(s, 6)).messages == s.messages[:6]
    for n in (0,):
        with pytest.raises(InvalidHistoryOp):
            history.regenerate_base(history.truncate(s, n))


def test_append_tool_results_and_reply() -> None:
    s = history.truncate(tool_session(), 2)  # the two calls, unanswered
    assert history.pending_calls(s) == (call("c1", a=1, b=2), call("c2", a=3, b=4))
    with pytest.raises(InvalidHistoryOp):
        history.append_reply(s, "too early")
    with pytest.raises(InvalidHistoryOp, match="'c9'"):
        history.append_tool_results(s, {"c1": "3", "c9": "x"})
    with pytest.raises(InvalidHistoryOp):
        history.append_tool_results(s, {})
    with pytest.raises(InvalidSession):
        history.append_tool_results(s, {"c1": 3})  # type: ignore[dict-item]
    # given out of order, they are stored in call order
    both = history.append_tool_results(s, {"c2": "7", "c1": "3"}, now=3.0)
    assert both.messages[2:] == (
        Message("tool", "3", 3.0, tool_call_id="c1"),
        Message("tool", "7", 3.0, tool_call_id="c2"),
    )
    assert history.pending_calls(both) == ()
    one = history.append_tool_results(s, {"c2": "7"}, now=3.0)
    assert history.pending_calls(one) == (call("c1", a=1, b=2),)
    with pytest.raises(InvalidHistoryOp):
        history.append_tool_results(one, {"c2": "again"})
    done = history.append_reply(both, "3 and 7", now=4.0)
    assert done.messages == tool_session().messages[:5]
    more = history.append_turn(done, "next", "", tool_calls=[call("c4")], now=5.0)
    assert more.messages[-1] == Message("assistant", "", 5.0, (call("c4"),))
    with pytest.raises(InvalidSession):
        history.append_turn(done, "next", "", tool_calls=[call("c1")], now=5.0)
