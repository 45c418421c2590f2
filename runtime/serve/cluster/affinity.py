"""Which replica should answer a request: the routing key of a chat request and the replicas in the order
to try them. Plain functions of their inputs (no Ray, no I/O), used by the Ray Serve request router.

The key names the conversation: `session:<id>` for a named conversation (the `X-Session-Id` header, the
session ids coding agents send, or `prompt_cache_key` / `metadata.user_id`: `runtime.serve.http.identity`;
else the request's `user` field), else `conv:<hash>` of the conversation's leading
messages (every message up to and including the first user message: the system prompt and the opening
question), so a stateless client that resends its growing history keeps the same key on every turn.

The order is rendezvous hashing (highest random weight): each replica scores `hash(key, replica)` and the
best score wins, so adding or losing a replica moves only that replica's share of keys. A replica the key
last went to comes first (its state is there, even after a spill). Bounded load: a replica whose queue is
above `max(load_factor * (total + 1) / n, least + slack)` (requests held, `least` the least loaded
replica's) moves behind the others, so one busy replica spills its next conversations to the next choice
instead of queueing them all.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec

from runtime.errors import InvalidConfig

__all__ = ["DEFAULT_LOAD_FACTOR", "DEFAULT_SLACK", "Placements", "conversation_key", "order", "routing_key", "score"]

DEFAULT_LOAD_FACTOR = 1.25
DEFAULT_SLACK = 2


class _Body(msgspec.Struct):
    """The fields of a chat request that name its conversation (everything else is ignored)."""

    messages: list[Any] | None = None
    user: str | None = None


_decoder = msgspec.json.Decoder(_Body)


def conversation_key(messages: list[Any]) -> str:
    """`conv:<hash>` of the messages up to and including the first user message (role and content only)."""
    lead: list[Any] = []
    for m in messages:
        if isinstance(m, dict):
            lead.append([m.get("role"), m.get("content")])
            if m.get("role") == "user":
                break
        else:
            lead.append(m)
    digest = hashlib.blake2b(msgspec.json.encode(lead), digest_size=16).hexdigest()
    return f"conv:{digest}"


def routing_key(session_header: str | None, body: bytes) -> str:
    """The key of a chat request; a body that is not a chat request gets a key of its own bytes.
    `session_header`: the conversation the request names (`runtime.serve.http.identity.conversation_of`)."""
    if session_header:
        return f"session:{session_header}"
    try:
        req = _decoder.decode(body)
    except msgspec.DecodeError:
        return f"body:{hashlib.blake2b(body, digest_size=16).hexdigest()}"
    if req.user:
        return f"session:{req.user}"
    if req.messages:
        return conversation_key(req.messages)
    return f"body:{hashlib.blake2b(body, digest_size=16).hexdigest()}"


def score(key: str, replica: str) -> int:
    """The rendezvous weight of `replica` for `key` (64 bits, stable across processes)."""
    data = f"{key}\x00{replica}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def order(
    key: str,
    loads: Mapping[str, int],
    *,
    last: str | None = None,
    load_factor: float = DEFAULT_LOAD_FACTOR,
    slack: int = DEFAULT_SLACK,
) -> list[str]:
    """The replicas of `loads` (replica -> requests it holds) in the order to try them for `key`."""
    if not loads:
        return []
    ranked = sorted(loads, key=lambda r: score(key, r), reverse=True)
    if last is not None and last in loads:
        ranked.remove(last)
        ranked.insert(0, last)
    total = sum(max(0, n) for n in loads.values())
    least = min(loads.values())
    bound = max(load_factor * (total + 1) / len(loads), least + slack)
    fits = [r for r in ranked if loads[r] <= bound]
    return fits + [r for r in ranked if loads[r] > bound]


class Placements:
    """Where each key went last (bounded: the least recently routed keys are forgotten first)."""

    def __init__(self, capacity: int = 100_000) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidConfig(f"capacity must be an int >= 1, not {capacity!r}")
        self.capacity = capacity
        self._last: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        return self._last.get(key)

    def put(self, key: str, replica: str) -> None:
        self._last[key] = replica
        self._last.move_to_end(key)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)

    def forget_replica(self, replica: str) -> None:
        """Drop a replica that is gone (its keys fall back to rendezvous order)."""
        for key in [k for k, r in self._last.items() if r == replica]:
            del self._last[key]

    def __len__(self) -> int:
        return len(self._last)
