"""Scheduling policies: which waiting request runs next. Small objects chosen by name.

A policy sees only candidates (the oldest waiting request of each session) and decides synchronously.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Candidate:
    """A request that may run next: the head of its session's queue."""

    request_id: int
    session_id: str
    arrival: int  # arrival order, smaller is older
    skips: int  # how often another request was chosen while this one could have run


class Policy(Protocol):
    name: str

    def pick(self, candidates: Sequence[Candidate], affinity: Callable[[Candidate], int]) -> Candidate:
        """Choose one of the (non-empty) candidates; `affinity` scores how much of its state is at hand."""
        ...


class Fifo:
    """Arrival order, as llama-server serves its queue."""

    name = "fifo"

    def pick(self, candidates: Sequence[Candidate], affinity: Callable[[Candidate], int]) -> Candidate:
        return min(candidates, key=lambda c: c.arrival)


class Affinity:
    """Prefer the request whose state the slot or the RAM cache holds most of (fewer swaps), oldest first
    among equals, but never pass over a request more than `max_skips` times."""

    name = "affinity"

    def __init__(self, max_skips: int = 4) -> None:
        if max_skips < 0:
            raise ValueError("max_skips must be >= 0")
        self.max_skips = max_skips

    def pick(self, candidates: Sequence[Candidate], affinity: Callable[[Candidate], int]) -> Candidate:
        starved = [c for c in candidates if c.skips >= self.max_skips]
        if starved:
            return min(starved, key=lambda c: c.arrival)
        return max(candidates, key=lambda c: (affinity(c), -c.arrival))


POLICIES: dict[str, Callable[[], Policy]] = {"fifo": Fifo, "affinity": Affinity}


def make_policy(name: str | Policy) -> Policy:
    if not isinstance(name, str):
        return name
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
