"""Scheduling policies: which waiting request runs next. Small objects chosen by name.

A policy sees only candidates (the oldest waiting request of each session) and decides synchronously.
`Fair` also decides, between two n_batch chunks of a running prefill, whether that prefill yields the slot
(`Preemptive.preempt`); see docs/fair-slot.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

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


@dataclass(frozen=True, slots=True)
class Cost:
    """A request's predicted cost in tokens: prompt tokens to evaluate (those no cached state holds) and the
    most it may generate. Estimated when it is queued; exact for a paused request (its prompt less what the
    slot has done)."""

    prefill: int = 0
    generate: int = 0

    @property
    def total(self) -> int:
        return self.prefill + self.generate


def cost_of(candidate: object) -> int:
    """A candidate's predicted cost (0 when it carries none: treated as small)."""
    cost = getattr(candidate, "cost", None)
    return cost.total if isinstance(cost, Cost) else 0


@dataclass(frozen=True, slots=True)
class Running:
    """The running request as a preemption check sees it, between two prefill chunks."""

    session_id: str
    held_s: float  # seconds it has held the slot since it (re)started
    remaining: Cost  # prompt tokens still to prefill, and its generation budget
    skips: int  # times it was passed over since it last started


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


@runtime_checkable
class Preemptive(Protocol):
    """A policy that may pause a running prefill at an n_batch boundary (asked from the slot's thread)."""

    def preempt(self, running: Running, waiting: Sequence[Candidate]) -> bool:
        """Whether the running prefill should yield now to one of `waiting` (heads that could run next)."""
        ...


PREFILL_QUANTUM_MS = 500.0  # the default: several n_batch chunks of SmolLM2 here, a pause's save+load is ~1/20 of it


class Fair:
    """Shortest predicted cost first, with a time quantum for prefill and a bound on being passed over.

    - pick: a request passed over `max_skips` times runs first (oldest such); otherwise the oldest of those whose
      predicted cost (`Cost.total`: uncached prompt tokens + max_tokens) is within `similar` times the smallest
      (turns of about the same size keep their arrival order; a long one waits for the short ones).
    - preempt: a prefill that has held the slot for `quantum_ms` yields at the next n_batch boundary when a
      request waits whose predicted cost is below what the running one has left. Its state stays a cached
      prefix; it resumes in its place (skips counted from then), and runs at least `quantum_ms` each time.

    So a paused request waits for at most `max_skips` other requests between two quanta of its own, and
    every request is passed over at most `max_skips` times in a row: nothing starves.
    """

    name = "fair"

    def __init__(self, quantum_ms: float = PREFILL_QUANTUM_MS, max_skips: int = 4, similar: float = 2.0) -> None:
        if not quantum_ms >= 0:
            raise InvalidConfig(f"prefill_quantum_ms must be >= 0, not {quantum_ms!r}")
        if max_skips < 0:
            raise InvalidConfig("max_skips must be >= 0")
        if not similar >= 1:
            raise InvalidConfig(f"similar must be >= 1, not {similar!r}")
        self.quantum_ms = float(quantum_ms)
        self.max_skips = max_skips
        self.similar = similar

    def pick(self, candidates: Sequence[C], affinity: Callable[[C], int]) -> C:
        starved = [c for c in candidates if c.skips >= self.max_skips]
        if starved:
            return min(starved, key=lambda c: c.arrival)
        least = min(cost_of(c) for c in candidates)
        return min((c for c in candidates if cost_of(c) <= least * self.similar), key=lambda c: c.arrival)

    def preempt(self, running: Running, waiting: Sequence[Candidate]) -> bool:
        if running.held_s * 1000.0 < self.quantum_ms or running.skips >= self.max_skips:
            return False
        left = running.remaining.total
        return any(w.session_id != running.session_id and cost_of(w) < left for w in waiting)


POLICIES: dict[str, Callable[[], Policy]] = {"fifo": Fifo, "affinity": Affinity, "fair": Fair}


def make_policy(name: str | Policy, prefill_quantum_ms: float | None = None) -> Policy:
    """The policy of that name (`prefill_quantum_ms`: `fair`'s quantum; ignored by the others)."""
    if not isinstance(name, str):
        return name
    if name == "fair" and prefill_quantum_ms is not None:
        return Fair(prefill_quantum_ms)
    try:
        return POLICIES[name]()
    except KeyError:
        raise InvalidConfig(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
