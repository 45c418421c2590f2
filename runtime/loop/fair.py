"""Fair share across API keys: which key's request runs next, before the policy chooses among its requests.

A request's key is its session id's namespace (`namespace_of`): the text before the first `@` of an id
the HTTP layer put in a tenant's namespace (`NAME@client-id`), "" for every other id. The scheduler asks
`KeyShare.pick` for a key among those with a request that may run, then its policy among that key's
requests only.

The rule is start-time fair queueing with one request as the unit: each key has a virtual start
`vt[key]`; the key with the smallest start runs (the oldest request first among equals), the virtual
clock becomes that start, and the key's start moves on by `1 / weight`. A key that had nothing waiting
starts at the clock, never below it, so it cannot bank credit while idle and a key that has waited gets
the next turn: one key's backlog delays another key's next request by at most the request running when
it arrived. With weights `wa` and `wb` both backlogged, the keys run in the ratio `wa : wb`. Decided
synchronously, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction

from runtime.errors import InvalidConfig

__all__ = ["KeyShare", "namespace_of"]


def namespace_of(session_id: str) -> str:
    """The key (tenant name) whose namespace `session_id` is in: the text before its first `@` ("" if none)."""
    name, at, _ = session_id.partition("@")
    return name if at else ""


def check_weight(weight: object) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
        raise InvalidConfig(f"a key's weight must be an int from 1 to 1000, not {weight!r}")
    return weight


class KeyShare:
    """Weighted round robin among keys (start-time fair queueing); `weight(key)` is each key's weight."""

    def __init__(self, weight: Callable[[str], int] = lambda _key: 1) -> None:
        self._weight = weight
        self._clock = Fraction(0)
        self._start: dict[str, Fraction] = {}  # keys served recently: their next virtual start

    def set_weights(self, weight: Callable[[str], int]) -> None:
        self._weight = weight

    def pick(self, ready: Iterable[tuple[str, int]]) -> str:
        """The key to serve among `ready` (key, arrival of its oldest ready request) pairs (non-empty)."""
        oldest: dict[str, int] = {}
        for key, arrival in ready:
            oldest[key] = min(arrival, oldest.get(key, arrival))
        for key in oldest:  # a key that had nothing waiting starts at the clock
            self._start[key] = max(self._start.get(key, self._clock), self._clock)
        key = min(oldest, key=lambda k: (self._start[k], oldest[k]))
        self._clock = self._start[key]
        self._start[key] += Fraction(1, check_weight(self._weight(key)))
        for idle in [k for k, s in self._start.items() if k not in oldest and s <= self._clock]:
            del self._start[idle]  # it would restart at the clock anyway: forget it (bounded memory)
        return key
