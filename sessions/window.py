"""The context window: which messages of a long conversation make the prompt. Pure functions, no model.

A conversation is split into turns: a turn starts at a user message and holds every message up to the
next one (the reply, tool calls and their results), so a turn is never split. The system message is always
kept (pinned messages are not implemented yet). With the "window" policy, the prompt keeps the newest turns
that fit; when they stop fitting, the oldest turns are dropped in one large step, until the turns before
the newest one fill at most `keep` of the budget, so that the following turns extend a cached prefix again
until the window fills once more. The cut is a function of the message sizes alone (replayed from the
first turn), so every turn of a conversation, before and after a restart, sees the same cut points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KEEP", "Window", "common_prefix", "plan", "turn_starts"]

KEEP = 0.2
"""After a cut the kept turns before the newest fill at most this fraction of the budget. Chosen by the
long-conversation benchmark (SmolLM2, n_ctx 2048, 32-token replies, 300 turns, prefill / ideal prefill):
0.125 -> 1.21, 0.2 -> 1.45, 0.25 -> 1.52, 0.5 -> 2.75, dropping one turn at a time -> 56: the largest
fraction (the most context kept after a cut) within 1.5."""


@dataclass(frozen=True, slots=True)
class Window:
    """The plan for one prompt: the first kept turn, and whether the prompt fits the budget."""

    first_turn: int
    fits: bool  # False: even the newest turn alone does not fit the budget


def turn_starts(roles: Sequence[str]) -> list[int]:
    """Index of each turn's first message (a user message; leading non-user messages form turn 0)."""
    starts = [i for i, r in enumerate(roles) if r == "user"]
    if roles and (not starts or starts[0] != 0):
        starts.insert(0, 0)
    return starts


def plan(turn_sizes: Sequence[int], fixed: int, budget: int, keep: float = KEEP) -> Window:
    """Replay the cuts over turns of `turn_sizes` tokens (the last one is the turn being answered).

    `fixed`: tokens always in the prompt (the system message; the generation prompt is counted in the last
    turn); `budget`: the tokens the prompt may take (the context less the room for the reply). Each turn
    that makes the kept turns overflow cuts the turns before it down to `keep * budget` (never dropping
    that turn itself).
    """
    first, total = 0, 0
    for i, size in enumerate(turn_sizes):
        total += size
        if fixed + total <= budget:
            continue
        # the turns before this one are cut down to `keep` of the budget (less, if this turn needs the room);
        # the amount does not depend on this turn's size, which grows once it is answered: a turn replayed
        # with its reply makes the same cut it made when it was asked
        target = min(keep * budget, budget - size)
        while first < i and fixed + total - size > target:
            total -= turn_sizes[first]
            first += 1
    fits = fixed + total <= budget
    return Window(first, fits)


def common_prefix(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> int:
    """How many messages `a` and `b` share from the start."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i
