"""Scheduling policies: which waiting request runs next. Small objects chosen by name.

A policy sees only candidates (the oldest waiting request of each session) and decides synchronously.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from runtime.errors import InvalidConfig


class Candidate(Protocol):
    """A request that may run next: the head of its session's queue (the scheduler's jobs are these)."""

    @property
    def session_id(self) -> str: ...

    @property
    def arrival(self) -> int:  # arrival order, smaller is older
        ...

    @property
    def skips(self) -> int:  # how often a later request was chosen while this one could have run
        ...


C = TypeVar("C", bound=Candidate)


class Policy(Protocol):
    name: str

    def pick(self, candidates: Sequence[C], affinity: Callable[[C], int]) -> C:
        """Choose one of the (non-empty) candidates; `affinity` scores how much of its state is at hand."""
        ...


class Fifo:
    """Arrival order, as llama-server serves its queue."""

    name = "fifo"

    def pick(self, candidates: Sequence[C], affinity: Callable[[C], int]) -> C:
        return min(candidates, key=lambda c: c.arrival)


class Affinity:
    """Prefer the request whose state the slot or the RAM cache holds most of (fewer swaps), oldest first
    among equals, but never pass over a request more than `max_skips` times."""

    name = "affinity"

    def __init__(self, max_skips: int = 4) -> None:
        if max_skips < 0:
            raise InvalidConfig("max_skips must be >= 0")
        self.max_skips = max_skips

    def pick(self, candidates: Sequence[C], affinity: Callable[[C], int]) -> C:
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
        raise InvalidConfig(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
