"""Each kind of turn is its own frozen type (`runtime/loop/turn_kinds.py`): what it answers, what it commits, what
is new in it. Model-free."""

from __future__ import annotations

import dataclasses

import pytest

from runtime.loop.turn_kinds import (
    Chat,
    Complete,
    CompletePrompt,
    Edit,
    Regenerate,
    ToolResults,
    Turn,
    new_chars,
    pending,
)
from runtime.types import RequestKind
from sessions import Sampling, Session, history


def talk() -> Session:
    s = history.append_user(Session.new("s", system="be brief"), "hello")
    s = history.append_reply(s, "hi there")
    return history.append_user(s, "what is 2+2?")


def answered() -> Session:
    return history.append_reply(talk(), "4")


def test_each_kind_answers_its_own_session() -> None:
    s = answered()
    assert [m.content for m in pending(Chat(overrides={}, message="and 3+3?"), s, True).messages][-2:] == [
        "4",
        "and 3+3?",
    ]
    assert [m.content for m in pending(Regenerate(overrides={}), s, True).messages] == [
        "hello",
        "hi there",
        "what is 2+2?",
    ]
    edited = pending(Edit(overrides={}, index=0, message="hey"), s, True)
    assert [m.content for m in edited.messages] == ["hey"]


def test_a_completion_replaces_a_named_transcript_keeping_its_settings() -> None:
    stored = Session.new("s", sampling=Sampling(temperature=0.25), metadata={"k": "v"})
    given = talk()
    got = pending(Complete(overrides={}, conversation=given), stored, True)
    assert got.messages == given.messages and got.system == "be brief"
    assert (got.sampling, got.metadata, got.created) == (stored.sampling, stored.metadata, stored.created)
    assert pending(Complete(overrides={}, conversation=given), stored, False) is given


def test_what_commits_and_what_creates() -> None:
    convo = talk()
    kinds: list[tuple[Turn, RequestKind, bool, bool]] = [
        (Chat(overrides={}, message="m"), RequestKind.CHAT, True, True),
        (ToolResults(overrides={}, results={"c1": "42"}), RequestKind.CHAT, True, True),
        (Regenerate(overrides={}), RequestKind.REGENERATE, True, False),
        (Edit(overrides={}, index=0, message="m"), RequestKind.EDIT, True, False),
        (Complete(overrides={}, conversation=convo), RequestKind.COMPLETE, True, True),
        (Complete(overrides={}, conversation=convo, stored=False), RequestKind.COMPLETE, False, True),
        (CompletePrompt(overrides={}, prompt=(1, 2, 3)), RequestKind.COMPLETE, False, False),
    ]
    for turn, kind, commit, creates in kinds:
        assert (turn.kind, turn.commit, turn.creates) == (kind, commit, creates), turn


def test_new_chars_counts_what_is_new() -> None:
    assert new_chars(Chat(overrides={}, message="x" * 10)) == 10
    assert new_chars(ToolResults(overrides={}, results={"a": "xy", "b": "xyz"})) == 5
    assert new_chars(Edit(overrides={}, index=0, message="abcd")) == 4
    assert new_chars(Regenerate(overrides={})) == 0
    assert new_chars(CompletePrompt(overrides={}, prompt=(1,))) == 0
    # a completion: what follows its last assistant message (the system prompt too when there is none)
    assert new_chars(Complete(overrides={}, conversation=talk())) == len("what is 2+2?")
    first = history.append_user(Session.new("s", system="sys"), "hello")
    assert new_chars(Complete(overrides={}, conversation=first)) == len("hello") + len("sys")


def test_turns_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Chat(overrides={}, message="m").message = "other"  # type: ignore[misc]
