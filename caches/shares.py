"""Shares of a cache tier among API keys: which key's state a full tier evicts first.

Every cached state has an owner: the key namespace of the session whose request left it in the slot
(`owner_of`: the text before the first `@` of a session id the HTTP layer put in a key's namespace, "" for
any other id). A tier over its limit takes its victims from the owner furthest over its share, then that
owner's first victim by the tier's own order (LRU, or turnstile's predicted-use order):

- the owners present are those holding a state in the tier (a state being saved counts as held);
- owner k's share of the limit is `limit * w_k / W`, W the weights of the owners present (weights from the
  key file, 1 for a namespace no key has): a key alone on the server may use the whole tier;
- owner k is over its share by `charged_k - share_k` (compared as `charged_k * W - limit * w_k`, integers);
- `charged_k` counts each of the owner's states at its whole size, blocks it shares with another state
  included: sharing a prefix with another key's state never lowers a key's charge, so no key pushes its
  bytes onto another (the tier's byte limit itself still counts a shared block once).

With one owner the order is the tier's own, unchanged (llama-server's rules stay exact without keys). The
owner decides eviction only; lookups go by tokens (a loaded state holds the KV of the very tokens the
prompt begins with, whoever saved it), so an owner never gives access. Plain functions of their inputs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

__all__ = ["Weights", "is_owner", "owner_of", "share_order", "worst_owner"]

Weight = Callable[[str], int]


_KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def is_owner(owner: str) -> bool:
    """Whether `owner` can be stored as one: a key name (1 to 64 of `[A-Za-z0-9._-]`) or "" (no key)."""
    return not owner or _KEY_NAME.fullmatch(owner) is not None


def owner_of(session_id: str) -> str:
    """The key (tenant name) whose namespace `session_id` is in: the text before its first `@`; "" if there is
    none, or if that text is not a key name (an id the HTTP layer did not make)."""
    name, at, _ = session_id.partition("@")
    return name if at and is_owner(name) else ""


def _one(_owner: str) -> int:
    return 1


class Weights:
    """The keys' weights the tiers of one slot share (`of(owner)`); every owner weighs 1 until `set`."""

    def __init__(self) -> None:
        self.of: Weight = _one

    def set(self, weight: Weight) -> None:
        self.of = weight


def worst_owner(charged: dict[str, int], limit: int, weight: Weight, among: Sequence[str]) -> str | None:
    """The owner of `among` furthest over its share of `limit` (`charged`: every present owner's bytes); ties go
    to the earlier in `among`. None if `among` is empty."""
    if not among:
        return None
    w = {o: max(1, weight(o)) for o in charged}
    total = sum(w.values())
    return max(among, key=lambda o: (charged.get(o, 0) * total - limit * w.get(o, 1), -among.index(o)))


def share_order(
    order: Sequence[int],
    owners: Sequence[str],
    charges: Sequence[int],
    limit: int,
    weight: Weight,
    incoming: tuple[str, int] | None = None,
) -> list[int]:
    """`order` (entry indices, the tier's first victim first) rearranged by share: each next victim is the next
    of the owner then furthest over its share, the charges of the victims before it taken off.

    `owners[i]`, `charges[i]`: entry i's owner and bytes (every entry, listed in `order` or not: an entry that
    is never a victim still counts for its owner); `incoming`: a state being saved, (owner, bytes). With one
    owner present, or no limit, `order` itself."""
    charged: dict[str, int] = {}
    for owner, c in zip(owners, charges, strict=True):
        charged[owner] = charged.get(owner, 0) + c
    if incoming is not None:
        charged[incoming[0]] = charged.get(incoming[0], 0) + incoming[1]
    if len(charged) <= 1 or limit <= 0:
        return list(order)
    queues: dict[str, list[int]] = {}
    for i in order:
        queues.setdefault(owners[i], []).append(i)
    heads = dict.fromkeys(queues, 0)
    pos = {i: k for k, i in enumerate(order)}
    out: list[int] = []
    while len(out) < len(order):
        # owners with a victim left, in the order of their next victim (the tie-break)
        among = sorted((o for o in queues if heads[o] < len(queues[o])), key=lambda o: pos[queues[o][heads[o]]])
        worst = worst_owner(charged, limit, weight, among)
        assert worst is not None
        i = queues[worst][heads[worst]]
        heads[worst] += 1
        charged[worst] -= charges[i]
        out.append(i)
    return out
