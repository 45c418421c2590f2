"""Every tool case of tests/support/tool_cases.py (llama.cpp's test-chat.cpp outputs and expectations, and our malformed
ones) read through its real template as the Runtime reads a reply: the parse gives the expected message, and
streamed at every prefix (`parse_partial` after each character) the pieces add up to the same message.

Reasoning is compared without the whitespace at its two ends: how much of the template's whitespace around the
tags belongs to the reasoning is the reasoning split's business, checked against llama-server itself by
tests/reasoning/test_reasoning_models.py (test-chat.cpp expects `I'm\\nthinking` where llama-server's reply keeps the
newline before `</think>`); content and calls are compared exactly.
"""

from __future__ import annotations

import pytest

from runtime.errors import ToolCallParseError
from tests.support.tool_cases import CASES, Case
from tests.support.tool_reading import Read, read_streamed, read_whole, stored, view


def expected(case: Case) -> Read:
    return Read(case.reasoning, case.content, tuple((c.name, c.arguments, c.id or "") for c in case.calls))


def same(got: Read, case: Case) -> None:
    want = expected(case)
    assert got.content == want.content
    assert got.reasoning.strip() == want.reasoning.strip()
    assert [(n, a) for n, a, _ in got.calls] == [(n, a) for n, a, _ in want.calls]
    for (_, _, gid), c in zip(got.calls, case.calls, strict=True):
        if c.id is not None:  # the syntax writes the id: it is the model's; else a fresh one
            assert gid == c.id
        else:
            assert gid


@pytest.mark.parametrize("case", [c for c in CASES if not c.error], ids=lambda c: c.name)
def test_the_output_parses_to_the_expected_message(case: Case) -> None:
    same(read_whole(case), case)


@pytest.mark.parametrize("case", [c for c in CASES if c.error], ids=lambda c: c.name)
def test_a_malformed_output_is_a_typed_error(case: Case) -> None:
    with pytest.raises(ToolCallParseError):
        read_whole(case)


@pytest.mark.parametrize("case", [c for c in CASES if not c.error], ids=lambda c: c.name)
def test_streamed_at_every_prefix_the_pieces_add_up_to_the_message(case: Case) -> None:
    streamed = read_streamed(case)
    same(streamed, case)
    whole = read_whole(case)
    assert streamed.calls == whole.calls  # ids included (the same seed)


@pytest.mark.parametrize("case", [c for c in CASES if c.error], ids=lambda c: c.name)
def test_streaming_a_malformed_output_never_raises(case: Case) -> None:
    """Partial readings of a malformed reply still only grow; the end is not a message (no assertion on it)."""
    problems: list[str] = []
    try:
        read_streamed(case, check=problems.append)
    except ToolCallParseError:  # pragma: no cover - parse_partial must not raise
        pytest.fail("parse_partial raised")
    assert [p for p in problems if "not JSON" not in p] == []


@pytest.mark.parametrize("case", [c for c in CASES if c.reconstruct], ids=lambda c: c.name)
def test_the_stored_reply_renders_back_as_the_generated_text(case: Case) -> None:
    """test-chat.cpp's reconstruction: the parsed reply, stored and rendered after the prompt, gives back the
    prompt and the output exactly (the template may add its end of turn), so the next turn reuses it."""
    got = read_whole(case)
    v = view(case.template)
    user = [{"role": "user", "content": "Hey there"}]
    again = v.prompt(case, [*user, stored(got.reasoning, got.content, list(got.calls))], generation=False)
    assert again.startswith(v.prompt(case, user) + case.output)
