"""The help desk's tests: the model's replies come from cassettes/test_triage.json (recorded once with
`pytest --turnstile-record-mode once`), so they run without the model; `turnstile_scripted` checks the app's
own logic with scripted replies."""

import json

import pytest
from triage import Desk, Triage

pytestmark = pytest.mark.anyio


async def test_a_crash_is_sorted(turnstile):
    triage = await Desk(turnstile).sort("t1", "The app crashes when I click save. I lose my work!")
    assert isinstance(triage, Triage)
    assert triage.category in ("bug", "question", "billing")


async def test_a_draft_answers_and_remembers(turnstile):
    desk = Desk(turnstile)
    first = await desk.draft("t2", "How do I reset my password?")
    again = await desk.draft("t2", "Thanks. And how do I change my email?")
    assert first and again
    session = await turnstile.get_session("draft-t2")
    assert [m.role for m in session.messages] == ["user", "assistant", "user", "assistant"]


async def test_a_reply_cut_short_goes_to_a_human(turnstile_scripted):
    turnstile_scripted.backend.reply = lambda messages: json.dumps({"category": "billing", "urgent": False})
    desk = Desk(turnstile_scripted, max_tokens=1)  # the scripted reply is cut after one word
    assert await desk.sort("t3", "I was charged twice.") == Triage(category="question", urgent=True)
