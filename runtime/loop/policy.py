"""Scheduling policies: which waiting request runs next. Small objects chosen by name.

A policy sees only candidates (the oldest waiting request of each session) and decides synchronously.
`Fair` also decides, between two n_batch chunks of a running prefill, whether that prefill yields the slot
(`Preemptive.preempt`), and from when a running chunk is aborted for it (`Aborting.abort_at`); see
docs/fair-slot.md.
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


def decoding(candidate: object) -> bool:
    """Whether a candidate is a generation paused after a token (it has its first token already)."""
    return bool(getattr(candidate, "decoding", False))


def prompt_paused(candidate: object) -> bool:
    """Whether a candidate is a prefill paused between (or in) its chunks: it has started, and has no token yet."""
    return bool(getattr(candidate, "prompt_paused", False))


def steps_to_first(candidate: object) -> float:
    """A request's predicted time to its first token, in decode steps: its prefill at `PREFILL_PER_STEP` tokens a
    step, plus the step that samples the token."""
    cost = getattr(candidate, "cost", None)
    return (cost.prefill if isinstance(cost, Cost) else 0) / PREFILL_PER_STEP + 1


@dataclass(frozen=True, slots=True)
class Running:
    """The running request as a preemption check sees it, between two prefill chunks."""

    session_id: str
    held_s: float  # seconds it has held the slot since it (re)started
    remaining: Cost  # prompt tokens still to prefill, and its generation budget (left)
    skips: int  # times it was passed over since it last started
    decoding: bool = False  # it is generating (asked after a token), not prefilling (asked between chunks)


@dataclass(frozen=True, slots=True)
class Chunk:
    """The running request's prefill chunk as an abort decision sees it (perf_counter seconds)."""

    started: float  # when its evaluation began
    ends: float  # when it is predicted to end (inf: no rate measured yet)
    aborts: int = 0  # times this chunk (the same start) was aborted before


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
        """Whether the running prefill (or generation) should yield now to one of `waiting` (heads that could
        run next)."""
        ...


@runtime_checkable
class Aborting(Protocol):
    """A policy that may also stop a prefill inside a chunk (through llama.cpp's abort check)."""

    def abort_at(self, running: Running, waiting: Sequence[Candidate], chunk: Chunk, now: float) -> float:
        """From when (perf_counter seconds) the running chunk should be aborted for one of `waiting`; inf: never
        (it ends, and the request may pause at its boundary)."""
        ...


PREFILL_QUANTUM_MS = 500.0  # the default: several n_batch chunks of SmolLM2 here, a pause's save+load is ~1/20 of it
DECODE_QUANTUM_MS = 100.0  # a generation's least time on the slot before it yields (docs/fair-slot.md: measured)
PREFILL_ABORT_MS = 100.0  # a chunk predicted to end within this is finished, not aborted (docs/fair-slot.md)
MAX_ABORTS = 4  # times one chunk may be aborted; then it runs to its end (so a prefill always goes on)
# with `defer_replies` the prompt resumes between two first tokens, not after their replies, so one chunk meets
# every turn of a burst: 8 keeps a burst of 8 first tokens within a quantum (docs/fair-slot.md: measured)
MAX_ABORTS_DEFERRING = 8
PREFILL_PER_STEP = 32  # prompt tokens evaluated in the time of one decode step (SmolLM2, n_batch 256, measured)


class Fair:
    """Shortest predicted cost first, with a time quantum for prefill and decode and a bound on being passed over.

    - pick: a request passed over `max_skips` times runs first (oldest such). Otherwise, while generations are
      paused, requests that have no token yet and would have their first one sooner than any paused generation
      its end (`steps_to_first` below the least generation left) come first; among those (or among all, when
      there are none) the oldest of those whose predicted cost (`Cost.total`: uncached prompt tokens +
      max_tokens; left to do once paused) is within `similar` times the smallest (turns of about the same size
      keep their arrival order; a long one waits for the short ones).
    - preempt a prefill: one that has held the slot for `quantum_ms` yields at the next n_batch boundary when a
      request waits whose predicted cost is below what the running one has left.
    - abort a chunk (`abort_ms`; None: never): when `preempt` would pause the prefill at the next boundary, or
      will once the quantum is up, for a request whose cost is below what the running one has left by more
      than `similar` times, and the running chunk is predicted to go on for more than `abort_ms` after that, the
      chunk is aborted then (`abort_at`): its work is thrown away and evaluated again on resume. A chunk is
      aborted at most `max_aborts` times (default 4, 8 with `defer_replies`), so every prefill goes on.
    - preempt a generation (`decode_quantum_ms`; None: never): one that has held the slot that long yields after
      its next token when a request waits that has no token yet and would have its first one sooner than the
      running generation its end. So a short turn that arrives during a long generation, or during other
      short turns' replies, gets its first token within about a quantum; the paused generation goes on later
      from its exact state.
    - defer replies (`defer_replies`, off by default): generations that already have their first token do not
      preempt a prefill, wait while a paused one waits, and a running one yields to it right after its token.
      The short turns that arrive during a long prompt get their first tokens within about a quantum and the
      rest of their replies after it, so the long prompt ends near its time alone (docs/fair-slot.md: measured).
    Paused requests resume in their place (skips counted from then), and run at least a quantum each time.

    So a paused request waits for at most `max_skips` other requests between two quanta of its own, and
    every request is passed over at most `max_skips` times in a row: nothing starves.
    """

    name = "fair"

    def __init__(
        self,
        quantum_ms: float = PREFILL_QUANTUM_MS,
        max_skips: int = 4,
        similar: float = 2.0,
        decode_quantum_ms: float | None = DECODE_QUANTUM_MS,
        abort_ms: float | None = PREFILL_ABORT_MS,
        max_aborts: int | None = None,
        defer_replies: bool = False,
    ) -> None:
        if not quantum_ms >= 0:
            raise InvalidConfig(f"prefill_quantum_ms must be >= 0, not {quantum_ms!r}")
        if decode_quantum_ms is not None and not decode_quantum_ms >= 0:
            raise InvalidConfig(f"decode_quantum_ms must be >= 0 or None, not {decode_quantum_ms!r}")
        if abort_ms is not None and not abort_ms >= 0:
            raise InvalidConfig(f"prefill_abort_ms must be >= 0 or None, not {abort_ms!r}")
        if max_aborts is None:
            max_aborts = MAX_ABORTS_DEFERRING if defer_replies else MAX_ABORTS
        if max_skips < 0 or max_aborts < 0:
            raise InvalidConfig("max_skips and max_aborts must be >= 0")
        if not similar >= 1:
            raise InvalidConfig(f"similar must be >= 1, not {similar!r}")
        self.quantum_ms = float(quantum_ms)
        self.decode_quantum_ms = None if decode_quantum_ms is None else float(decode_quantum_ms)
        self.abort_ms = None if abort_ms is None or abort_ms == float("inf") else float(abort_ms)
        self.max_aborts = max_aborts
        self.max_skips = max_skips
        self.similar = similar
        self.defer_replies = defer_replies

    @property
    def pauses_decode(self) -> bool:
        return self.decode_quantum_ms is not None or self.defer_replies

    def pick(self, candidates: Sequence[C], affinity: Callable[[C], int]) -> C:
        if self.defer_replies and any(prompt_paused(c) for c in candidates):
            candidates = [c for c in candidates if not decoding(c)]  # replies wait for the paused prompt
        starved = [c for c in candidates if c.skips >= self.max_skips]
        if starved:
            return min(starved, key=lambda c: c.arrival)
        left = [cost_of(c) for c in candidates if decoding(c)]
        pool = candidates
        if left:  # first tokens before paused generations' ends, when they come sooner
            urgent = [c for c in candidates if not decoding(c) and steps_to_first(c) < min(left)]
            pool = urgent or candidates
        least = min(cost_of(c) for c in pool)
        return min((c for c in pool if cost_of(c) <= least * self.similar), key=lambda c: c.arrival)

    def preempt(self, running: Running, waiting: Sequence[Candidate]) -> bool:
        if running.skips >= self.max_skips:
            return False
        others = [w for w in waiting if w.session_id != running.session_id]
        if running.decoding:
            if self.defer_replies and any(prompt_paused(w) for w in others):
                return True  # a reply goes on after the paused prompt: it yields right after its token
            q = self.decode_quantum_ms
            if q is None or running.held_s * 1000.0 < q:
                return False
            left = running.remaining.generate
            return any(not decoding(w) and steps_to_first(w) < left for w in others)
        if running.held_s * 1000.0 < self.quantum_ms:
            return False
        left = running.remaining.total
        return any(cost_of(w) < left for w in self._for_prompt(others))

    def _for_prompt(self, waiting: Sequence[Candidate]) -> Sequence[Candidate]:
        """The waiting requests a running prefill may yield to: with `defer_replies`, only those with no token."""
        return [w for w in waiting if not decoding(w)] if self.defer_replies else waiting

    def abort_at(self, running: Running, waiting: Sequence[Candidate], chunk: Chunk, now: float) -> float:
        never = float("inf")
        if self.abort_ms is None or chunk.aborts >= self.max_aborts or running.skips >= self.max_skips:
            return never
        left = running.remaining.total  # the running chunk's tokens included
        others = [w for w in waiting if w.session_id != running.session_id]
        if running.decoding or not any(cost_of(w) * self.similar < left for w in self._for_prompt(others)):
            return never  # work is thrown away only for a request much cheaper than what this one has left
        at = now + max(0.0, self.quantum_ms / 1000.0 - running.held_s)  # when `preempt` would say yes
        return at if chunk.ends - at > self.abort_ms / 1000.0 else never


POLICIES: dict[str, Callable[[], Policy]] = {"fifo": Fifo, "affinity": Affinity, "fair": Fair}


def make_policy(
    name: str | Policy,
    prefill_quantum_ms: float | None = None,
    decode_quantum_ms: float | None = None,
    prefill_abort_ms: float | None = None,
    defer_replies: bool = False,
) -> Policy:
    """The policy of that name (`prefill_quantum_ms`, `decode_quantum_ms`: `fair`'s quanta, `prefill_abort_ms`: the
    least predicted rest of a chunk it aborts; None: the defaults, inf: generations never pause, chunks are never
    aborted; `defer_replies`: `Fair`'s; ignored by the others)."""
    if not isinstance(name, str):
        return name
    if name == "fair" and (
        (prefill_quantum_ms, decode_quantum_ms, prefill_abort_ms) != (None, None, None) or defer_replies
    ):
        d = DECODE_QUANTUM_MS if decode_quantum_ms is None else decode_quantum_ms
        return Fair(
            PREFILL_QUANTUM_MS if prefill_quantum_ms is None else prefill_quantum_ms,
            decode_quantum_ms=None if d == float("inf") else d,
            abort_ms=PREFILL_ABORT_MS if prefill_abort_ms is None else prefill_abort_ms,
            defer_replies=defer_replies,
        )
    try:
        return POLICIES[name]()
    except KeyError:
        raise InvalidConfig(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
