"""History operations as pure functions of Session values, and the export format."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessions import InvalidHistoryOp, InvalidSession, InvalidSessionId, Message, Sampling, Session, history


def m(role: Any, content: str, t: float) -> Message:
    return Message(role, content, t)


def sample() -> Session:
    return Session(
        id="s",
        system="sys",
        messages=(
            m("user", "u0", 1.0),
            m("assistant", "a0", 1.0),
            m("user", "u1", 2.0),
            m("assistant", "a1", 2.0),
            m("user", "u2", 3.0),
            m("assistant", "a2", 3.0),
        ),
        sampling=Sampling(temperature=0.0, seed=3, stop=("END",)),
        metadata={"owner": "planner", "tags": ["x"], "nested": {"n": 1}},
        created=1.0,
        updated=3.0,
        revision=3,
    )


def test_pure_ops_do_not_touch_the_input() -> None:
    s = sample()
    history.undo(s, 2)
    history.edit(s, 2, "new", now=9.0)
    history.truncate(s, 1)
    history.fork(s, "f", 2, now=9.0)
    assert s == sample()


def test_fork() -> None:
    f = history.fork(sample(), "f", 2, now=9.0)
    assert f.id == "f" and f.messages == sample().messages[:2]
    assert (f.created, f.updated, f.revision) == (9.0, 9.0, 0)
    assert (f.system, f.sampling, f.metadata) == (sample().system, sample().sampling, sample().metadata)
    assert f.metadata["tags"] is not sample().metadata["tags"]
    assert history.fork(sample(), "g", now=1.0).messages == sample().messages
    assert history.fork(sample(), "g", 0, now=1.0).messages == ()
    bad_upto: list[Any] = [-1, 7, 1.0, True]
    for bad in bad_upto:
        with pytest.raises(InvalidHistoryOp):
            history.fork(sample(), "g", bad)
    with pytest.raises(InvalidSessionId):
        history.fork(sample(), "bad id")


def test_undo_drops_whole_exchanges() -> None:
    assert history.undo(sample()).messages == sample().messages[:4]
    assert history.undo(sample(), 3).messages == ()
    trailing_user = history.edit(sample(), 4, "again", now=5.0)
    assert history.undo(trailing_user).messages == sample().messages[:4]
    bad_n: list[Any] = [0, 4, -1, 1.5]
    for bad in bad_n:
        with pytest.raises(InvalidHistoryOp):
            history.undo(sample(), bad)


def test_edit_replaces_a_user_message_and_drops_the_rest() -> None:
    e = history.edit(sample(), 2, "u1'", now=7.0)
    assert e.messages == (*sample().messages[:2], m("user", "u1'", 7.0))
    assert history.edit(sample(), -2, "last", now=7.0).messages[-1] == m("user", "last", 7.0)
    with pytest.raises(InvalidHistoryOp, match="assistant message"):
        history.edit(sample(), 1, "x")
    for bad in (6, -7):
        with pytest.raises(InvalidHistoryOp):
            history.edit(sample(), bad, "x")
    with pytest.raises(InvalidHistoryOp):
        history.edit(Session(id="e", created=1.0, updated=1.0), 0, "x")
    with pytest.raises(InvalidSession):
        history.edit(sample(), 0, None)  # type: ignore[arg-type]


def test_truncate() -> None:
    assert history.truncate(sample(), 3).messages == sample().messages[:3]
    assert history.truncate(sample(), 6) == sample()
    for bad in (-1, 7):
        with pytest.raises(InvalidHistoryOp):
            history.truncate(sample(), bad)


def test_append_turn_and_reply() -> None:
    s = history.append_turn(sample(), "u3", "a3", now=4.0)
    assert s.messages[-2:] == (m("user", "u3", 4.0), m("assistant", "a3", 4.0))
    with pytest.raises(InvalidHistoryOp):
        history.append_reply(sample(), "x")
    edited = history.edit(sample(), 4, "u2'", now=5.0)
    replied = history.append_reply(edited, "a2'", now=6.0)
    assert replied.messages[-2:] == (m("user", "u2'", 5.0), m("assistant", "a2'", 6.0))


def test_export_shape() -> None:
    doc = json.loads(history.export(sample()))
    assert doc == {
        "format": "turnstile.session/1",
        "id": "s",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "u0", "created": 1.0},
            {"role": "assistant", "content": "a0", "created": 1.0},
            {"role": "user", "content": "u1", "created": 2.0},
            {"role": "assistant", "content": "a1", "created": 2.0},
            {"role": "user", "content": "u2", "created": 3.0},
            {"role": "assistant", "content": "a2", "created": 3.0},
        ],
        "sampling": {
            "temperature": 0.0,
            "top_k": 40,
            "top_p": 0.95,
            "min_p": 0.05,
            "repeat_penalty": 1.0,
            "repeat_last_n": 64,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "seed": 3,
            "max_tokens": None,
            "stop": ["END"],
            "ignore_eos": False,
        },
        "metadata": {"owner": "planner", "tags": ["x"], "nested": {"n": 1}},
        "created": 1.0,
        "updated": 3.0,
        "revision": 3,
    }


@pytest.mark.parametrize(
    "session",
    [
        sample(),
        Session(id="empty", created=0.1, updated=0.30000000000000004),
        Session(id="blank-system", system="", created=1.0, updated=1.0),
        Session(
            id="unicode",
            system="✓ ünïcode \u0000 \n",
            messages=(m("user", '"quoted" \\ 🦙', 1700000000.123456), m("assistant", "", 1e-7)),
            metadata={"f": 1.0000000000000002, "big": 2**64 - 1, "neg": -(2**63), "b": True, "z": None},
            created=1e9,
            updated=1e9,
        ),
    ],
)
def test_export_import_round_trips_exactly(session: Session) -> None:
    back = history.import_(history.export(session))
    assert back == session
    assert history.import_(history.export(session).encode()) == session
    assert history.export(back) == history.export(session)


def test_import_renames_and_fills_defaults() -> None:
    assert history.import_(history.export(sample()), new_id="t") == Session(
        **{**{f: getattr(sample(), f) for f in sample().__struct_fields__}, "id": "t"}
    )
    bare = json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "hi", "name": "bob"}])
    assert history.import_(bare, new_id="b", now=5.0) == Session(
        id="b", system="S", messages=(m("user", "hi", 5.0),), created=5.0, updated=5.0
    )
    minimal = json.dumps({"messages": [], "sampling": {"top_k": 1}})
    assert history.import_(minimal, new_id="c", now=2.0) == Session(
        id="c", sampling=Sampling(top_k=1), created=2.0, updated=2.0
    )


@pytest.mark.parametrize(
    "data",
    [
        "",
        "not json",
        "{}",
        '{"messages": {}}',
        '{"messages": [{"role": "user"}]}',
        '{"messages": [{"role": "user", "content": null}]}',
        '{"messages": [{"role": "user", "content": ["part"]}]}',
        '{"messages": [{"role": "tool", "content": "x"}]}',
        '{"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]}',
        '{"messages": [], "format": "other/9"}',
        '{"messages": [], "metadata": [1]}',
        '{"messages": [], "revision": -1}',
        '{"messages": [], "sampling": 3}',
        '{"messages": [], "created": "yesterday"}',
    ],
)
def test_import_refuses_malformed_documents(data: str) -> None:
    with pytest.raises(InvalidSession):
        history.import_(data, new_id="x")


def test_import_needs_an_id() -> None:
    with pytest.raises(InvalidSessionId):
        history.import_("[]")
    with pytest.raises(InvalidSessionId):
        history.import_('{"messages": [], "id": "bad id"}')
    with pytest.raises(InvalidSessionId):
        history.import_(history.export(sample()), new_id="")
