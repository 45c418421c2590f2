"""Quotas per API key: what one key may hold and spend, so that no key can take the server from the others.

A key's `Quotas` (each None: no limit) come from the command line's defaults (`turnstile serve --quota
NAME=VALUE`, repeatable) overridden by the settings on the key's line of the key file (`NAME: KEY
sessions=100 rpm=60 # comment`):

    sessions=N      sessions (X-Session-Id conversations and stored Responses conversations) the key holds
    bytes=N         bytes it stores: its sessions (as exported) plus its stored responses (K, M, G suffixes)
    queued=N        its requests in flight at once (queued or running)
    rpm=N           requests per minute (a token bucket of N, refilled at N per minute)
    tpm=N           tokens per minute (prompt + generated; charged when a request ends, so a request is
                    admitted while the bucket is above zero and may take it below)
    max_tokens=N    the most tokens one reply may generate (the default when a request names none; a request
                    asking for more is a 400, as it can never succeed)
    weight=N        its share of the slot and of the RAM and disk tiers against other keys (default 1)

Over a quota the request is answered 429 with `Retry-After` (seconds) in the dialect's error shape and
nothing is created or queued. The `Ledger` keeps each key's usage in memory; `/metrics` reports it against
each limit (`turnstile_key_usage` / `turnstile_key_limit` by key name and quota). A key's usage is decided
synchronously from these counters; only counting its sessions and their bytes reads the session store (in a
worker thread), and only for a request that would create a session (`sessions`) or store bytes (`bytes`).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from runtime.errors import InvalidConfig, NotFound
from runtime.log import get_logger
from runtime.loop.fair import namespace_of
from runtime.reply import Reply
from runtime.serve.http.errors import ApiError

if TYPE_CHECKING:
    from runtime.api import Runtime
    from runtime.loop.scheduler import Job

__all__ = ["SETTINGS", "Ledger", "Quotas", "parse_settings"]

log = get_logger(__name__)

# the name in a key file or on the command line -> the Quotas field
SETTINGS = {
    "sessions": "sessions",
    "bytes": "stored_bytes",
    "queued": "queued",
    "rpm": "requests_per_min",
    "tpm": "tokens_per_min",
    "max_tokens": "max_tokens",
    "weight": "weight",
}
_SIZE = re.compile(r"([0-9]{1,15})([KMG]?)")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class Quotas:
    """One key's limits (None: none) and its weight in fair share."""

    sessions: int | None = None
    stored_bytes: int | None = None
    queued: int | None = None
    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    max_tokens: int | None = None
    weight: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low = 1 if f.name in ("weight", "queued", "requests_per_min", "tokens_per_min", "max_tokens") else 0
            if value is None and f.name != "weight":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidConfig(f"quota {f.name} must be an int >= {low}, not {value!r}")
        if self.weight > 1000:
            raise InvalidConfig(f"weight must be at most 1000, not {self.weight}")

    def with_settings(self, settings: Mapping[str, int]) -> Quotas:
        return replace(self, **{SETTINGS[k]: v for k, v in settings.items()})

    def limits(self) -> dict[str, int]:
        """The quotas that are set, by their setting name (as /metrics labels them)."""
        out = {name: getattr(self, attr) for name, attr in SETTINGS.items() if name != "weight"}
        return {k: v for k, v in out.items() if v is not None}


def parse_settings(words: Iterable[str]) -> dict[str, int]:
    """`NAME=VALUE` words as settings (ValueError naming the first bad one)."""
    out: dict[str, int] = {}
    for word in words:
        name, eq, value = word.partition("=")
        if not eq or name not in SETTINGS:
            raise ValueError(f"{word!r} is not one of {', '.join(n + '=N' for n in SETTINGS)}")
        m = _SIZE.fullmatch(value)
        if m is None or (m.group(2) and name != "bytes"):
            raise ValueError(f"{word!r}: the value is not a whole number" + (" (K, M, G allowed)" * (name == "bytes")))
        if name in out:
            raise ValueError(f"{name} is given twice")
        out[name] = int(m.group(1)) * _UNITS[m.group(2)]
    Quotas().with_settings(out)  # range checks, as InvalidConfig
    return out


@dataclass
class Bucket:
    """A token bucket of `capacity`, refilled at `capacity` per minute; its level may go below zero (debt)."""

    capacity: int
    clock: Callable[[], float] = time.monotonic
    level: float = field(init=False)
    at: float = field(init=False)

    def __post_init__(self) -> None:
        self.level = float(self.capacity)
        self.at = self.clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(float(self.capacity), self.level + (now - self.at) * self.capacity / 60.0)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until the level reaches `amount` (0: it has)."""
        self._refill()
        return 0.0 if self.level >= amount else (amount - self.level) * 60.0 / self.capacity

    def take(self, amount: float) -> None:
        self._refill()
        self.level -= amount

    def used(self) -> int:
        """What was spent and not refilled yet (usage against the per-minute quota)."""
        self._refill()
        return max(0, math.ceil(self.capacity - self.level))


@dataclass
class Usage:
    """One key's counters."""

    in_flight: int = 0
    requests: Bucket | None = None
    tokens: Bucket | None = None
    sessions: int = 0  # as last counted
    stored_bytes: int = 0  # as last counted
    rejected: dict[str, int] = field(default_factory=dict)  # quota -> requests refused over it


def _too_many(quota: str, message: str, retry_after: float) -> ApiError:
    return ApiError(
        429,
        message,
        type="rate_limit_error",
        code=f"{quota}_quota_exceeded",
        headers={"retry-after": str(max(1, math.ceil(retry_after)))},
    )


class Ledger:
    """Every key's usage against its quotas. `prefixes`: each key name's session-id prefix ("" for the one
    key of a server with one, else `NAME@`); `quotas(name)` a key's quotas; `stored(name)` the bytes of
    its stored responses."""

    def __init__(
        self,
        prefixes: Mapping[str, str],
        quotas: Callable[[str], Quotas],
        stored: Callable[[str], int] = lambda _name: 0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quotas = quotas
        self._prefixes = dict(prefixes)
        self._stored = stored
        self._clock = clock
        self._usage: dict[str, Usage] = {}
        self._sizes: dict[str, int] = {}  # session id -> its exported size, as last measured
        self._dirty: set[str] = set()  # sessions changed since they were measured
        self._attached: object = None  # the Runtime whose scheduler reports to this ledger

    def attach(self, rt: Runtime) -> None:
        """Take the tokens of every finished turn from `rt`'s scheduler, and give it the keys' weights."""
        if self._attached is rt:
            return
        self._attached = rt
        rt.scheduler.on_done.append(self._finished)
        rt.set_key_weights(self.weight)

    def weight(self, namespace: str) -> int:
        """The fair-share weight of a session namespace's key (1 for a namespace no key has)."""
        name = self._name_of(namespace)
        return self.quotas(name).weight if name is not None else 1

    def _finished(self, job: Job[Any]) -> None:
        if isinstance(job.result, Reply):
            used = job.result.usage.prefilled_tokens + job.result.usage.generated_tokens
            self.charge(namespace_of(job.session_id), job.session_id, used)

    def usage(self, name: str) -> Usage:
        u = self._usage.get(name)
        if u is None:
            q = self.quotas(name)
            u = self._usage[name] = Usage(
                requests=Bucket(q.requests_per_min, self._clock) if q.requests_per_min else None,
                tokens=Bucket(q.tokens_per_min, self._clock) if q.tokens_per_min else None,
            )
        return u

    def _refuse(self, name: str, quota: str, message: str, retry_after: float) -> ApiError:
        u = self.usage(name)
        u.rejected[quota] = u.rejected.get(quota, 0) + 1
        log.info("quota.exceeded", key=name, quota=quota, retry_after=retry_after)
        return _too_many(quota, message, retry_after)

    # --- a request's way through ---------------------------------------------------------------------

    def enter(self, name: str) -> None:
        """A turn request arrives (before its body is read): queued, rpm and tpm, or a 429."""
        q, u = self.quotas(name), self.usage(name)
        if q.queued is not None and u.in_flight >= q.queued:
            raise self._refuse(name, "queued", f"the key has {u.in_flight} requests in flight (quota {q.queued})", 1)
        if u.tokens is not None and (wait := u.tokens.wait_for(1)) > 0:
            raise self._refuse(name, "tpm", f"the key is over its {q.tokens_per_min} tokens per minute", wait)
        if u.requests is not None:
            if (wait := u.requests.wait_for(1)) > 0:
                raise self._refuse(name, "rpm", f"the key is over its {q.requests_per_min} requests per minute", wait)
            u.requests.take(1)
        u.in_flight += 1

    def leave(self, name: str) -> None:
        self.usage(name).in_flight -= 1

    def charge(self, namespace: str, session_id: str, tokens: int) -> None:
        """A turn of `session_id` (in the key whose namespace is `namespace`) ended having used `tokens`."""
        self._dirty.add(session_id)
        name = self._name_of(namespace)
        if name is None:
            return
        u = self.usage(name)
        if u.tokens is not None and tokens > 0:
            u.tokens.take(tokens)

    def _name_of(self, namespace: str) -> str | None:
        """The key name of a session namespace (`runtime.loop.fair.namespace_of`); with one key, that key."""
        if len(self._prefixes) == 1:
            return next(iter(self._prefixes))
        return namespace if namespace in self._prefixes else None

    def max_tokens(self, name: str, kwargs: dict[str, Any], param: str = "max_tokens") -> None:
        """Apply the key's max_tokens ceiling to a turn's options: the default, and a 400 above it."""
        ceiling = self.quotas(name).max_tokens
        if ceiling is None:
            return
        asked = kwargs.get("max_tokens")
        if asked is None:
            kwargs["max_tokens"] = ceiling
        elif isinstance(asked, int) and asked > ceiling:
            raise ApiError.bad_request(
                f"{param} {asked} is over this key's ceiling of {ceiling}", param=param, code="max_tokens_over_quota"
            )

    async def admit_turn(
        self, rt: Runtime, name: str, namespace: str, session: str | None, kwargs: dict[str, Any], param: str
    ) -> None:
        """Everything a dialect does before it queues a turn of key `name` into `session` (None: stateless)
        with options `kwargs`: the max_tokens ceiling (`param`: the dialect's name for it), the key's
        namespace for a stateless turn, the sessions and bytes quotas."""
        self.max_tokens(name, kwargs, param)
        if session is None and namespace:
            kwargs["namespace"] = namespace
        await self.admit(rt, name, session)

    async def admit(self, rt: Runtime, name: str, session: str | None) -> None:
        """Before a turn that stores into `session` (None: stores nothing) is queued: the sessions quota
        (when the session does not exist yet) and the bytes quota; 429 over either."""
        q = self.quotas(name)
        if session is None or (q.sessions is None and q.stored_bytes is None):
            return
        new_session: str | None = session
        if new_session is not None and await anyio.to_thread.run_sync(rt.store.exists, new_session):
            new_session = None
        await self.measure(rt, name)
        u = self.usage(name)
        if new_session is not None and q.sessions is not None and u.sessions >= q.sessions:
            raise self._refuse(name, "sessions", f"the key holds {u.sessions} sessions (quota {q.sessions})", 60)
        if q.stored_bytes is not None and u.stored_bytes >= q.stored_bytes:
            raise self._refuse(name, "bytes", f"the key stores {u.stored_bytes} bytes (quota {q.stored_bytes})", 60)

    def measures(self, name: str) -> bool:
        """Whether the key has a quota on what it stores (sessions or bytes), which `measure` counts."""
        q = self.quotas(name)
        return q.sessions is not None or q.stored_bytes is not None

    async def measure(self, rt: Runtime, name: str) -> None:
        """Count the key's sessions and their bytes (sessions changed since the last count are measured again)."""
        prefix = self._prefixes.get(name, f"{name}@")
        ids = [i for i in await rt.list_sessions() if i.startswith(prefix) and len(i) > len(prefix)]
        todo = [i for i in ids if i in self._dirty or i not in self._sizes]
        self._dirty.difference_update(todo)

        def sizes() -> dict[str, int]:
            out: dict[str, int] = {}
            for sid in todo:
                with contextlib.suppress(NotFound):  # deleted meanwhile
                    out[sid] = len(rt.store.export(sid))
            return out

        self._sizes.update(await anyio.to_thread.run_sync(sizes))
        present = set(ids)
        for sid in [s for s in self._sizes if s.startswith(prefix) and s not in present]:
            del self._sizes[sid]
        u = self.usage(name)
        u.sessions = len(ids)
        u.stored_bytes = sum(self._sizes.get(i, 0) for i in ids) + self._stored(name)

    # --- /metrics ------------------------------------------------------------------------------------

    def rejected(self) -> list[tuple[str, str, int]]:
        """(key name, quota, requests refused over it), for /metrics."""
        return [(n, q, c) for n in sorted(self._usage) for q, c in sorted(self._usage[n].rejected.items())]

    def rows(self) -> list[tuple[str, str, int | None, int | None]]:
        """(key name, quota, usage or None, limit or None) for each key and quota, for /metrics."""
        out: list[tuple[str, str, int | None, int | None]] = []
        for name in sorted(self._prefixes):
            q, u = self.quotas(name), self.usage(name)
            limits = q.limits()
            used: dict[str, int | None] = {
                "sessions": u.sessions,
                "bytes": max(u.stored_bytes, 0),
                "queued": u.in_flight,
                "rpm": u.requests.used() if u.requests is not None else 0,
                "tpm": u.tokens.used() if u.tokens is not None else 0,
            }
            if not self.measures(name):  # counted only for keys with a quota on what they store
                del used["sessions"], used["bytes"]
            used["max_tokens"] = None  # a ceiling per request: nothing is used up
            for quota, value in used.items():
                out.append((name, quota, value, limits.get(quota)))
        return out
