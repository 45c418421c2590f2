"""Waiting and running requests as the scheduling policies see them, for tests without a model."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.loop.policy import Cost, Running


@dataclass
class C:
    """A waiting request (a `Candidate`): its session, arrival order, times passed over and predicted cost."""

    session_id: str
    arrival: int
    skips: int = 0
    cost: Cost = field(default_factory=Cost)


def running(held_s: float, left: int, skips: int = 0, sid: str = "long") -> Running:
    """The running request: held the slot `held_s` seconds, `left` prompt tokens to go."""
    return Running(sid, held_s, Cost(left, 0), skips)
