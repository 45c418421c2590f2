"""llama-server's host prompt cache (`--cache-ram`) for one slot, generic over the state type.

The rules are llama-server's `server_context::get_available_slot` (one slot) and
`server_prompt_cache::{alloc, load, update}` (tools/server/server-task.cpp). They are plain functions of
their inputs (`update_due`, `plan_save`, `pick_better`, `plan_update`) with no I/O; `PromptCache`
applies them. The C++ computes its ratios in `float`; so do the rules here (`_f32`), so that a decision
on the edge (a fraction that rounds across 0.5, say) is the same as llama-server's.

Evicted entries are handed to the caller, which sends them to the disk tier:

    if PromptCache.wants_update(slot.tokens, prompt):
        pc.save(slot.tokens, nbytes, lambda: slot.state_bytes())   # `state()` runs only if stored
        if (got := pc.take_better(slot.tokens, prompt)) is not None:
            slot.tokens, slot.state = got
        for entry in pc.update():   # what `save` evicted to make room, then what `update` evicted
            disk.put(entry.tokens, entry.state)

`save` never returns its evictions; it queues them. `update()` returns (and clears) everything evicted
since the previous `update()` / `drain_evicted()`, oldest first; `drain_evicted()` does the same for a
caller that saves without updating.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import msgspec

from caches.blocks import held_victims
from caches.shares import Weights, share_order
from caches.tokens import f32 as _f32
from caches.tokens import fdiv as _fdiv
from caches.tokens import keeps_enough, lcp
from runtime.errors import InvalidConfig
from runtime.log import get_logger

__all__ = [
    "DEFAULT_LIMIT_BYTES",
    "Entry",
    "PromptCache",
    "PromptCacheStats",
    "SavePlan",
    "default_limit_bytes",
    "lcp",
    "pick_better",
    "plan_save",
    "plan_update",
    "update_due",
]

log = get_logger(__name__)

S = TypeVar("S")

DEFAULT_LIMIT_BYTES = 8192 << 20
"""llama-server's `--cache-ram` default: 8192 MiB."""


def default_limit_bytes(meminfo: str = "/proc/meminfo") -> int:
    """llama-server's 8192 MiB, but at most a quarter of the memory available now (MemAvailable)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    fields = line.split()
                    kib = int(fields[1])
                    return min(DEFAULT_LIMIT_BYTES, kib * 1024 // 4)
    except (OSError, ValueError, IndexError):
        pass
    return DEFAULT_LIMIT_BYTES


# ---------------------------------------------------------------------------------------------------------
# The rules, as plain functions.


def update_due(slot: Sequence[int], prompt: Sequence[int], similarity: float = 0.1) -> bool:
    """Whether llama-server (one slot) saves the slot and looks for a better cached prompt.

    `get_available_slot`: the slot is taken "by similarity" when it is not empty and
    lcp / len(prompt) > similarity; then the cache is updated only if the slot would keep under half of
    its tokens (f_keep < 0.5). Otherwise it is taken "by LRU" and the cache is always updated; that is
    also the case for every request when the similarity search is off (`similarity == 0`).
    """
    thold = _f32(similarity)
    if thold == 0.0 or not slot:
        return True
    f_sim = _fdiv(lcp(slot, prompt), len(prompt))
    if not (f_sim > 0.0 and f_sim > thold):  # NaN (empty prompt) compares false: by LRU
        return True
    f_keep = _f32(_f32(f_sim * _f32(len(prompt))) / _f32(len(slot)))
    return f_keep < 0.5


@dataclass(frozen=True, slots=True)
class SavePlan:
    """What `save` does, decided by `plan_save` before anything changes."""

    store: bool
    """Whether the slot becomes a new (newest) entry; `state()` is called only then."""
    reason: str
    """`stored`, `empty`, `held` (an entry already holds the slot whole) or `too_large`."""
    drop: tuple[int, ...] = ()
    """Indices of entries the slot holds whole (replaced by it), removed first."""
    evict: int = 0
    """Then this many of the oldest remaining entries are evicted to make room."""


def plan_save(
    entries: Sequence[tuple[Sequence[int], int]],
    slot: Sequence[int],
    nbytes: int,
    limit_bytes: int,
    order: Sequence[int] | None = None,
) -> SavePlan:
    """`server_slot::prompt_save` + `server_prompt_cache::alloc`; `entries`: (tokens, nbytes), oldest first.

    In the C++ order: an empty slot is skipped; a slot that an entry holds whole is skipped; an entry
    larger than the byte limit alone is refused (and the cache left as it is); entries the slot holds
    whole are dropped; the oldest are evicted until the new entry fits. `order`: the entries (indices, none
    of them dropped) in the order to evict them instead of oldest first (`caches.shares`); `evict` then counts
    along it.
    """
    if not slot:
        return SavePlan(False, "empty")
    slot = tuple(slot)  # entries hold tuples: compare like with like, without a copy per entry
    n = len(slot)
    if any(lcp(tokens, slot) == n for tokens, _ in entries):
        return SavePlan(False, "held")
    if limit_bytes > 0 and nbytes > limit_bytes:
        return SavePlan(False, "too_large")
    drop = tuple(i for i, (tokens, _) in enumerate(entries) if lcp(tokens, slot) == len(tokens))
    evict = 0
    if limit_bytes > 0:
        queue = range(len(entries)) if order is None else order
        kept = [entries[i][1] for i in queue if i not in drop]
        total = sum(kept)
        while evict < len(kept) and total + nbytes > limit_bytes:
            total -= kept[evict]
            evict += 1
    return SavePlan(True, "stored", drop, evict)


def pick_better(entries: Sequence[Sequence[int]], slot: Sequence[int], prompt: Sequence[int]) -> int | None:
    """`server_prompt_cache::load`: the index of the entry to move into the slot, or None.

    An entry that would keep under a quarter of itself is never taken ("don't trash large prompts").
    Scanning oldest first, an entry wins if both its kept fraction (lcp / its length) and its similarity
    (lcp / prompt length) are larger than the best so far, starting from the slot's own (an empty slot's
    kept fraction is -1, so any entry beats it); ties keep the earlier one.
    """
    prompt = tuple(prompt)
    lcp_slot = lcp(slot, prompt)
    f_keep_best = _fdiv(lcp_slot, len(slot)) if slot else -1.0
    f_sim_best = _fdiv(lcp_slot, len(prompt))
    best: int | None = None
    for i, tokens in enumerate(entries):
        n = lcp(tokens, prompt)
        f_keep = _fdiv(n, len(tokens))
        f_sim = _fdiv(n, len(prompt))
        if not keeps_enough(n, len(tokens)):
            continue
        if f_keep_best < f_keep and f_sim_best < f_sim:
            f_keep_best, f_sim_best, best = f_keep, f_sim, i
    return best


def plan_update(entries: Sequence[tuple[int, int]], limit_bytes: int, limit_tokens: int) -> int:
    """`server_prompt_cache::update`: how many of the oldest to evict; `entries`: (nbytes, n_tokens).

    First the oldest while over the byte limit; then, only if there is a token limit, the oldest while
    over it, the limit raised (once, before that loop) to what the byte limit holds at the remaining
    entries' average bytes per token (at least 1).
    """
    sizes = [b for b, _ in entries]
    counts = [t for _, t in entries]
    total, n_tok, k = sum(sizes), sum(counts), 0
    if limit_bytes > 0:
        while k < len(entries) and total > limit_bytes:
            total, n_tok, k = total - sizes[k], n_tok - counts[k], k + 1
    per_token = max(1.0, _fdiv(total, max(1, n_tok)))
    limit_cur = limit_tokens
    if limit_bytes > 0:
        limit_cur = max(limit_tokens, int(_f32(_f32(limit_bytes) / per_token)))
    if limit_tokens > 0:
        while k < len(entries) and n_tok > limit_cur:
            total, n_tok, k = total - sizes[k], n_tok - counts[k], k + 1
    return k


# ---------------------------------------------------------------------------------------------------------
# The cache.


@dataclass(frozen=True, slots=True)
class Entry(Generic[S]):
    """A cached slot: its tokens, its size in bytes (state and checkpoints) and the state itself.

    `saved_at` (the cache's request clock when it was saved) and `wait` (how many requests the state it
    continues waited in the cache before it was loaded; None: not known) predict when it is used again
    (turnstile's held-bytes eviction, `PromptCache(held=...)`); `used`: it was loaded and kept (a prompt
    used only part of it), so its conversation goes on from a newer state. `owner`: the key namespace whose
    request left the state (`caches.shares`: what the tier's shares charge it to)."""

    tokens: tuple[int, ...]
    nbytes: int
    state: S
    saved_at: int = 0
    wait: int | None = None
    used: bool = False
    owner: str = ""


class PromptCacheStats(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a `PromptCache`'s contents and counters."""

    entries: int
    bytes: int
    n_tokens: int
    limit_bytes: int
    limit_tokens: int
    saves: int
    """Slots stored."""
    skipped: int
    """`save` calls that stored nothing (empty slot, already held, larger than the limit)."""
    replaced: int
    """Entries dropped because a saved slot held them whole."""
    hits: int
    """`take_better` calls that moved an entry into the slot."""
    misses: int
    evictions: int
    evicted_bytes: int


class PromptCache(Generic[S]):
    """llama-server's `server_prompt_cache` for one slot; entries oldest first. Not thread-safe."""

    @staticmethod
    def wants_update(slot: Sequence[int], prompt: Sequence[int], similarity: float = 0.1) -> bool:
        """Whether a request for `prompt` updates the cache (`update_due`)."""
        return update_due(slot, prompt, similarity)

    def __init__(
        self,
        limit_bytes: int,
        limit_tokens: int,
        *,
        held: Callable[[Sequence[Entry[S]]], int] | None = None,
        weights: Weights | None = None,
    ) -> None:
        """`limit_bytes` (see `default_limit_bytes`) and `limit_tokens` (llama-server: n_ctx); 0: no limit.

        `held`: when entries share memory (`caches.blocks`), the bytes some entries hold together; the
        limits then count that (`held_victims`, turnstile's rule) instead of the sum of the entries' whole
        sizes, and the victims are the entries predicted to be used last (`_victim_order`) instead of the
        oldest (None: llama-server's rule, exactly).

        `weights`: the keys' weights; with entries of several owners, the victims come from the owner furthest
        over its share first (`caches.shares`), each owner's in the order above. One owner: that order exactly.
        """
        if limit_bytes < 0 or limit_tokens < 0:
            raise InvalidConfig("prompt cache limits must be >= 0 (0: no limit)")
        self.limit_bytes = limit_bytes
        self.limit_tokens = limit_tokens
        self._held = held
        self.weights = weights if weights is not None else Weights()
        self._entries: list[Entry[S]] = []
        self.version = 0
        """Bumped by every change of the entries (a cheap change stamp for callers that index them)."""
        self._evicted: list[Entry[S]] = []
        self._saves = self._skipped = self._replaced = 0
        self._hits = self._misses = self._evictions = self._evicted_bytes = 0
        # turnstile's eviction order (with `held`): a request clock, and each conversation's reuse distance
        self._clock = 0
        self._slot_wait: int | None = None  # the wait of the entry the slot's state was loaded from
        self._taken_wait: int | None = None  # the same for this request's load, until `tick`
        self._waits: deque[int] = deque(maxlen=64)

    @property
    def entries(self) -> Sequence[Entry[S]]:
        """The entries, oldest first (a copy)."""
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def counts_held(self) -> bool:
        """Whether the limits count the bytes the entries hold together (turnstile's rule, `held`)."""
        return self._held is not None

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries)

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self._entries)

    def plan_store(
        self, slot: Sequence[int], nbytes: int, without: Entry[S] | None = None, owner: str = ""
    ) -> tuple[SavePlan, tuple[Entry[S], ...]]:
        """What `save` would do, changing nothing: its plan and the entries it would evict to make room (with
        `held`, none here: those victims are chosen once the new entry is in). `without`: as if that entry were
        gone first; `owner`: whose state it is (the victims come from the owner furthest over its share first,
        `caches.shares`; with one owner, the oldest: llama-server's alloc)."""
        entries = [e for e in self._entries if e is not without]
        pairs = [(e.tokens, e.nbytes) for e in entries]
        plan = plan_save(pairs, slot, nbytes, self.limit_bytes)
        if not plan.store or self._held is not None:
            return plan, ()
        victims = list(range(len(pairs)))  # the order `plan.evict` counts along, dropped entries left out
        if plan.evict:
            dropped = set(plan.drop)
            order = [i for i in victims if i not in dropped]
            victims = self._share_order(order, (owner, nbytes), dropped, entries)
            plan = plan_save(pairs, slot, nbytes, self.limit_bytes, victims)
        evict = [i for i in victims if i not in plan.drop][: plan.evict]
        return plan, tuple(entries[i] for i in evict)

    def save(self, slot: Sequence[int], nbytes: int, state: Callable[[], S], owner: str = "") -> bool:
        """Store the slot (`state()` is called only if it is stored) as `owner`'s; True if stored.

        Entries evicted to make room (`plan_store`) are queued for `update()` / `drain_evicted()`.
        """
        plan, victims = self.plan_store(slot, nbytes, owner=owner)
        if not plan.store:
            self._skipped += 1
            if plan.reason == "too_large":
                log.warning("prompt_cache.too_large", n_tokens=len(slot), nbytes=nbytes, limit_bytes=self.limit_bytes)
            else:
                log.debug("prompt_cache.skip", reason=plan.reason, n_tokens=len(slot))
            return False
        # held: the victims are chosen once the entry is in, below
        if plan.drop:
            self._replaced += len(plan.drop)
            log.debug("prompt_cache.replaced", count=len(plan.drop))
        self._evict([i for i, e in enumerate(self._entries) if any(e is v for v in victims)], dropped=plan.drop)
        try:
            value = state()
        except MemoryError:
            # alloc's bad_alloc: shrink the byte limit to 40 % of what is held, then update.
            held = self.nbytes if self._held is None else self._held(self._entries)
            self.limit_bytes = max(1, int(0.4 * held))
            log.error("prompt_cache.alloc_failed", limit_bytes=self.limit_bytes)
            self._skipped += 1
            self.update_limits()
            return False
        self._entries.append(Entry(tuple(slot), nbytes, value, self._clock, self._slot_wait, owner=owner))
        if self._held is not None:
            self._evict(self._held_evictions(0, keep=1))
        self.version += 1
        self._saves += 1
        log.debug("prompt_cache.save", n_tokens=len(slot), nbytes=nbytes, entries=len(self._entries))
        return True

    def take_better(
        self, slot: Sequence[int], prompt: Sequence[int], *, retain_partial: bool = False
    ) -> tuple[list[int], S] | None:
        """Remove and return (tokens, state) of the entry that serves `prompt` better than the slot.

        With `retain_partial` (turnstile's rule, not llama-server's), an entry the prompt does not continue
        whole stays cached: the slot will drop part of it, and the conversation it belongs to keeps its state.
        """
        i = pick_better([e.tokens for e in self._entries], slot, prompt)
        if i is None:
            self._misses += 1
            return None
        if retain_partial and lcp(self._entries[i].tokens, prompt) < len(self._entries[i].tokens):
            entry = self._entries[i]
            self._entries[i] = replace(entry, used=True)
        else:
            entry = self._entries.pop(i)
            self.version += 1
        self._loaded(entry)
        self._hits += 1
        log.debug("prompt_cache.load", n_tokens=len(entry.tokens), kept=lcp(entry.tokens, prompt))
        return list(entry.tokens), entry.state

    def take(self, entry: Entry[S], *, keep: bool) -> bool:
        """Count a load of `entry` (chosen by the caller's own rule); remove it unless `keep`. False: it is
        no longer held (evicted or replaced meanwhile)."""
        self._loaded(entry)  # the caller loads it either way: the slot's state continues it
        i = next((i for i, e in enumerate(self._entries) if e is entry), None)
        if i is None:
            return False
        if not keep:
            del self._entries[i]
            self.version += 1
        else:
            self._entries[i] = replace(entry, used=True)
        self._hits += 1
        log.debug("prompt_cache.load", n_tokens=len(entry.tokens), kept_entry=keep)
        return True

    def tick(self) -> None:
        """One request is done (turnstile's rules call this once per request): the slot's state now
        continues the entry loaded during it, if any; the request clock advances."""
        self._slot_wait, self._taken_wait = self._taken_wait, None
        self._clock += 1

    def _loaded(self, entry: Entry[S]) -> None:
        wait = self._clock - entry.saved_at
        self._taken_wait = wait
        self._waits.append(wait)

    def update(self) -> list[Entry[S]]:
        """Evict over the limits; return every entry evicted since the last update/drain, oldest first."""
        self.update_limits()
        return self.drain_evicted()

    def update_limits(self) -> None:
        """Evict the oldest over the limits: whole sizes (llama-server's rule), or with `held` the bytes the
        entries hold together (a block no remaining entry uses is freed with the last entry that did)."""
        if self._held is None:
            order = self._share_order(range(len(self._entries)))
            sizes = self._sizes()
            self._evict(order[: plan_update([sizes[i] for i in order], self.limit_bytes, self.limit_tokens)])
        else:
            self._evict(self._held_evictions(self.limit_tokens))

    def drain_evicted(self) -> list[Entry[S]]:
        """Return and forget the entries evicted (by `save` or `update`) since the last update/drain."""
        out, self._evicted = self._evicted, []
        return out

    def stats(self) -> PromptCacheStats:
        return PromptCacheStats(
            entries=len(self._entries),
            bytes=self.nbytes,
            n_tokens=self.n_tokens,
            limit_bytes=self.limit_bytes,
            limit_tokens=self.limit_tokens,
            saves=self._saves,
            skipped=self._skipped,
            replaced=self._replaced,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            evicted_bytes=self._evicted_bytes,
        )

    def _held_evictions(self, limit_tokens: int, keep: int = 0) -> list[int]:
        held, es = self._held, self._entries
        assert held is not None
        return held_victims(
            self._share_order(self._victim_order(keep)),
            [len(e.tokens) for e in es],
            lambda kept: held([es[i] for i in kept]),
            self.limit_bytes,
            limit_tokens,
        )

    def _share_order(
        self,
        order: Sequence[int],
        incoming: tuple[str, int] | None = None,
        dropped: set[int] | None = None,
        entries: Sequence[Entry[S]] | None = None,
    ) -> list[int]:
        """`order` (indices into `entries`, default the cache's) rearranged by the owners' shares
        (`caches.shares.share_order`; `dropped` entries charge nothing): itself when every entry has one owner."""
        es = self._entries if entries is None else entries
        charges = [0 if dropped and i in dropped else e.nbytes for i, e in enumerate(es)]
        return share_order(order, [e.owner for e in es], charges, self.limit_bytes, self.weights.of, incoming)

    def _victim_order(self, keep: int) -> list[int]:
        """Entry indices, the first to evict first; never the newest `keep`.

        Oldest first (LRU) until some load has shown how long states wait for their conversation (so a
        round robin that never fits from its start stays LRU). Then the entries already loaded (kept because
        a prompt used them only in part: their conversation goes on from a newer state) go first, oldest
        first; then the entry predicted to be used last: predicted use = when it was saved + the wait of
        the state it continues (unknown: the median of the recent waits); one already past its prediction
        is predicted as far ahead as it is late. Under round robin over more conversations than fit, LRU
        evicts exactly the conversation that speaks next, every turn; this order keeps most of them and
        drops the ones that just spoke (the Belady choice there), while a conversation that comes back
        soon stays before those that come back late.
        """
        n = max(0, len(self._entries) - keep)
        if not self._waits:
            return list(range(n))
        median = statistics.median(self._waits)
        now = self._clock

        def predicted(i: int) -> float:
            e = self._entries[i]
            p = e.saved_at + (e.wait if e.wait is not None else median)
            return p if p >= now else 2 * now - p

        return sorted(range(n), key=lambda i: (not self._entries[i].used, -predicted(i), i))

    def _evict(self, indices: Sequence[int], dropped: Sequence[int] = ()) -> None:
        """Evict the entries at `indices` (queued for the caller); `dropped`: entries removed with them, not evicted."""
        out = set(indices) | set(dropped)
        if not out:
            return
        gone = [self._entries[i] for i in sorted(set(indices))]
        self._entries = [e for i, e in enumerate(self._entries) if i not in out]
        self.version += 1
        if not gone:
            return
        self._evicted.extend(gone)
        self._evictions += len(gone)
        self._evicted_bytes += sum(e.nbytes for e in gone)
        log.debug("prompt_cache.evict", count=len(gone), nbytes=sum(e.nbytes for e in gone), entries=len(self._entries))

    def _sizes(self) -> list[tuple[int, int]]:
        return [(e.nbytes, len(e.tokens)) for e in self._entries]
