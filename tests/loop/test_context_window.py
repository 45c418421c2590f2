"""The context policy: the planner (pure), and "window" / "error" through a Runtime over the scripted backend
(one token per character, so every size below is counted by hand)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runtime import ContextOverflow
from runtime.errors import InvalidConfig, InvalidRequest, InvalidSession
from runtime.log import capture_logs
from runtime.testing import ScriptedBackend
from sessions import MemoryStore, history
from sessions.window import plan, turn_starts
from tests.conftest import Scripted

# --- the planner ------------------------------------------------------------------------------------


def test_turns_start_at_user_messages() -> None:
    assert turn_starts(["user", "assistant", "user", "assistant", "user"]) == [0, 2, 4]
    assert turn_starts(["assistant", "user", "assistant", "tool", "assistant", "user"]) == [0, 1, 5]
    assert turn_starts([]) == []


def test_plan_cuts_in_one_step_down_to_keep() -> None:
    # budget 100, fixed 10: turns of 20 fit until the 5th (10 + 5 * 20 = 110 > 100), which cuts the turns
    # before it down to 10 + 20 * k <= 50: it keeps the two turns before it
    assert plan([20] * 4, 10, 100, keep=0.5).first_turn == 0
    w = plan([20] * 5, 10, 100, keep=0.5)
    assert (w.first_turn, w.fits) == (2, True)
    # the next turns extend the window until it overflows again
    assert [plan([20] * n, 10, 100, keep=0.5).first_turn for n in range(5, 11)] == [2, 2, 4, 4, 6, 6]
    # keep=1.0 is the naive policy: drop just enough, every turn
    assert [plan([20] * n, 10, 100, keep=1.0).first_turn for n in range(5, 9)] == [1, 2, 3, 4]


def test_a_turn_answered_makes_the_same_cut_it_made_when_asked() -> None:
    """The current turn is counted without its reply; replayed later, with it, the cut must not move."""
    asked = plan([30, 30, 30, 10], 10, 100, keep=0.5)  # 10 + 100 > 100: cut the turns before to <= 50
    assert asked.first_turn == 2
    answered = plan([30, 30, 30, 25, 10], 10, 100, keep=0.5)  # the same turn with its reply, then a new one
    assert answered.first_turn == 2  # (counting the reply in the cut would drop one more turn: a second cut)


def test_plan_never_drops_the_turn_being_answered() -> None:
    w = plan([20, 20, 95], 10, 100, keep=0.25)
    assert (w.first_turn, w.fits) == (2, False)
    assert plan([], 10, 100).fits
    assert not plan([], 101, 100).fits


def test_cut_points_are_a_function_of_the_history() -> None:
    """Replayed from the first turn: a later turn sees the same cuts the earlier turns made."""
    sizes = [7, 30, 12, 45, 9, 22, 31, 8, 50, 14, 26, 19, 40, 11]
    firsts = [plan(sizes[: n + 1], 5, 120, keep=0.25).first_turn for n in range(len(sizes))]
    assert firsts == sorted(firsts)  # the window only moves forward
    for n in range(1, len(sizes)):
        if firsts[n] == firsts[n - 1]:  # no cut: the prompt extends the previous one
            assert 5 + sum(sizes[firsts[n] : n + 1]) <= 120


# --- through the Runtime (scripted backend: a token per character) --------------------------------------

# "system: S\n" is 10 tokens; a turn is "user: qN\n" (9) + "assistant: echo: qN\n" (20) = 29; the prompt
# ends with "assistant: " (11). n_ctx 110 less max_tokens 10 leaves a budget of 100.
N_CTX = 110
GEN: dict[str, Any] = {"max_tokens": 10}


@pytest.fixture
def scripted_backend() -> Callable[[], ScriptedBackend]:
    return lambda: ScriptedBackend(n_ctx=N_CTX)


async def test_window_drops_whole_turns_in_large_steps(scripted: Scripted) -> None:
    async with scripted() as (rt, _backend):
        await rt.create_session("w", system="S", context="window")
        with capture_logs() as logs:
            replies = [await rt.chat("w", f"q{t}", **GEN) for t in range(10)]
        # prompt = 10 + 29 t + 20 until it passes 100 (t = 3); the cut keeps only the newest turn (keep 25)
        assert [r.usage.dropped_messages for r in replies] == [0, 0, 0, 6, 6, 6, 12, 12, 12, 18]
        assert [r.usage.prompt_tokens for r in replies] == [30, 59, 88, 30, 59, 88, 30, 59, 88, 30]
        assert [r.text for r in replies] == [f"echo: q{t}" for t in range(10)]
        cuts = [e for e in logs if e["event"] == "context.cut"]
        assert [(e["dropped_messages"], e["newly_dropped"], e["kept_messages"]) for e in cuts] == [
            (6, 6, 1),
            (12, 6, 1),
            (18, 6, 1),
        ]
        s = await rt.get_session("w")
        assert len(s.messages) == 20  # the stored history keeps every message
        assert s.context == "window"


async def test_a_turn_too_long_for_the_window_is_context_overflow(scripted: Scripted) -> None:
    async with scripted() as (rt, _backend):
        await rt.create_session("w", system="S", context="window")
        await rt.chat("w", "q0", **GEN)
        before = await rt.get_session("w")
        with pytest.raises(ContextOverflow) as err:
            await rt.chat("w", "x" * 95, **GEN)  # 10 + "user: " 6 + 95 + 1 + 11 = 123
        assert (err.value.n_prompt, err.value.n_ctx, err.value.room) == (123, N_CTX, 10)
        assert await rt.get_session("w") == before


async def test_error_policy_fails_when_the_history_outgrows_the_context(scripted: Scripted) -> None:
    async with scripted() as (rt, _backend):
        await rt.create_session("e", system="S")
        for t in range(3):
            await rt.chat("e", f"q{t}", **GEN)
        before = await rt.get_session("e")
        with pytest.raises(ContextOverflow) as err:
            await rt.chat("e", "q3", **GEN)
        assert err.value.n_prompt == 117
        assert await rt.get_session("e") == before


async def test_the_runtime_default_and_a_session_policy(scripted: Scripted) -> None:
    async with scripted(context="window") as (rt, _backend):
        await rt.create_session("d", system="S")  # None: the runtime's default, "window"
        await rt.create_session("e", system="S", context="error")
        for t in range(4):
            r = await rt.chat("d", f"q{t}", **GEN)
        assert r.usage.dropped_messages == 6
        for t in range(3):
            await rt.chat("e", f"q{t}", **GEN)
        with pytest.raises(ContextOverflow):
            await rt.chat("e", "q3", **GEN)


async def test_bad_policies_are_refused(scripted: Scripted) -> None:
    with pytest.raises(InvalidConfig):
        async with scripted(context="shift"):
            pass
    async with scripted() as (rt, _backend):
        with pytest.raises(InvalidRequest):
            await rt.create_session("x", context="truncate")  # type: ignore[arg-type]
        assert not rt.store.exists("x")


def test_the_policy_survives_export_and_import() -> None:
    s = MemoryStore().create("w", system="S", context="window")
    assert history.import_(history.export(s)).context == "window"
    plain = MemoryStore().create("p")
    assert '"context"' not in history.export(plain)
    assert history.import_(history.export(plain)).context is None
    with pytest.raises(InvalidSession):
        history.import_('{"messages": [], "id": "x", "context": "shift"}')


async def test_history_edits_give_the_window_of_the_edited_history(scripted: Scripted) -> None:
    async with scripted() as (rt, _backend):
        await rt.create_session("w", system="S", context="window")
        for t in range(10):
            await rt.chat("w", f"q{t}", **GEN)
        r = await rt.regenerate("w", **GEN)  # the same prompt again
        assert (r.usage.dropped_messages, r.usage.prompt_tokens) == (18, 30)
        await rt.undo("w")
        r = await rt.chat("w", "q9", **GEN)
        assert (r.usage.dropped_messages, r.usage.prompt_tokens) == (18, 30)
        r = await rt.edit("w", 2, "q1", **GEN)  # an edit of a dropped message: the history is 2 turns again
        assert (r.usage.dropped_messages, r.usage.prompt_tokens) == (0, 59)
        r = await rt.chat("w", "q2", **GEN)
        assert (r.usage.dropped_messages, r.usage.prompt_tokens) == (0, 88)
        assert len((await rt.get_session("w")).messages) == 6
