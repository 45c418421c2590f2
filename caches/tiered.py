"""The tiered cache: llama-server's RAM prompt cache, and behind it an optional disk tier.

It owns what happens to slot states between requests: when the slot is saved (llama-server's rules),
which cached state replaces it (RAM first, then disk), what spills to disk (every state that leaves RAM,
and a state too large for RAM), what is written on close, and where a conversation's state is now (for
the scheduler's affinity policy). The slot keeps only the sequence mechanics and calls `update` once
per request. Generic over the state type `S`; the disk tier stores `codec.encode(state)` bytes.

Synchronous and not thread-safe: the slot's worker thread is its only caller (`where` reads a snapshot
that is rebuilt only when the entries changed, so the event loop may call it between requests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

import msgspec

from caches.disk.format import Buffer
from caches.disk.tier import DiskTier
from caches.prompt_cache import Entry, PromptCache, pick_better
from caches.tokens import lcp
from runtime.log import get_logger

__all__ = ["Candidate", "Location", "LookupRule", "StateCodec", "Swap", "TieredCache", "TieredCacheStats"]

log = get_logger(__name__)

S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)
Location = Literal["ram", "disk", "none"]


class StateCodec(Protocol[S]):
    """How a state becomes bytes for the disk tier and back, and what it weighs in RAM.

    `encode` gives the bytes as buffers that the disk tier writes one after the other (never joined, so a
    state's own buffers are written without a copy); `decode` may keep views into the buffer it is given.
    """

    def encode(self, state: S) -> Sequence[Buffer]: ...

    def decode(self, data: memoryview) -> S: ...

    def nbytes(self, state: S) -> int: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """A cached state that could replace the slot's: where it is, what it keeps of the prompt, its size."""

    tier: Literal["ram", "disk"]
    kept: int
    """Prompt tokens prefix reuse keeps from it."""
    tokens: tuple[int, ...]
    nbytes: int
    index: int = -1
    """Its position among the RAM entries (-1: on disk)."""


class LookupRule(Protocol[S_contra]):
    """turnstile's lookup rule (`runtime.slot.lookup`): which state any tier holds is worth loading."""

    def kept(self, tokens: tuple[int, ...], state: S_contra | None, n_lcp: int) -> int:
        """Tokens prefix reuse keeps of a state sharing `n_lcp` with the prompt (`state` None: on disk)."""
        ...

    def choose(self, slot_kept: int, n_prompt: int, candidates: Sequence[Candidate]) -> Candidate | None: ...

    def worth_saving(self, lost: int, nbytes: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Swap:
    """What one `update` did: where a loaded state came from (None: the slot was kept) and the bytes moved."""

    source: Literal["ram", "disk"] | None
    saved: int
    restored: int


class TieredCacheStats(msgspec.Struct, frozen=True, kw_only=True):
    """Loads by tier and what RAM holds now."""

    swaps: int
    """Updates that replaced the slot's state."""
    ram_loads: int
    disk_loads: int
    ram_entries: int
    ram_bytes: int
    spilled: int
    """States written to the disk tier."""


class TieredCache(Generic[S]):
    """RAM prompt cache (`ram`, None: off) + disk tier (`disk`, None: off) for one slot."""

    def __init__(
        self,
        ram: PromptCache[S] | None,
        disk: DiskTier | None,
        codec: StateCodec[S],
        *,
        similarity: float = 0.1,
        retain_partial: bool = True,
        lookup: LookupRule[S] | None = None,
    ) -> None:
        """`lookup` None: llama-server's rule (`update`); a rule: turnstile's longest-state lookup."""
        self.ram = ram
        self.disk = disk
        self.codec = codec
        self.similarity = similarity
        # turnstile's rule (not llama-server's): an entry a prompt uses only in part stays cached
        self.retain_partial = retain_partial
        self.lookup = lookup
        self._swaps = self._ram_loads = self._disk_loads = self._spilled = 0
        self._ram_keys: tuple[int, frozenset[int]] = (-1, frozenset())
        self._disk_keys: set[int] = set()
        self.owner = ""
        """The key namespace whose request left the slot's state (`caches.shares`): a save charges it there."""

    # --- one request ------------------------------------------------------------------------------

    def update(
        self,
        slot: Sequence[int],
        prompt: Sequence[int],
        nbytes: Callable[[], int],
        snapshot: Callable[[], S],
        load: Callable[[list[int], S], bool],
        *,
        slot_kept: int | None = None,
    ) -> Swap:
        """llama-server's prompt cache update for a request, with the disk tier behind RAM.

        `nbytes()` is the slot's state size, `snapshot()` copies it (called only if it is stored), `load`
        moves a cached state into the slot (False: refused, the slot is then empty). With a `lookup` rule,
        turnstile's lookup instead (`_update_longest`); `slot_kept`: what prefix reuse keeps of the slot
        (default: the common prefix).
        """
        if self.lookup is not None:
            kept = lcp(slot, prompt) if slot_kept is None else slot_kept
            return self._update_longest(self.lookup, list(slot), prompt, kept, nbytes, snapshot, load)
        if not PromptCache.wants_update(slot, prompt, self.similarity):
            return Swap(None, 0, 0)
        slot = list(slot)
        saved = restored = 0
        source: Literal["ram", "disk"] | None = None
        evicted: list[Entry[S]] = []
        size = nbytes() if slot else 0
        ram = self.ram
        if ram is not None:
            if ram.save(slot, size, snapshot, self.owner):
                saved = size
                log.debug("cache.save", n_tokens=len(slot), nbytes=size)
            evicted += ram.drain_evicted()
        if not saved and slot and self.disk is not None and (ram is None or 0 < ram.limit_bytes < size):
            saved = self._spill(slot, snapshot())  # too large for RAM (or no RAM cache): the disk keeps it
        if ram is not None:
            better = ram.take_better(slot, prompt, retain_partial=self.retain_partial)
            if better is not None:
                if load(*better):
                    source, restored = "ram", self.codec.nbytes(better[1])
                    self._ram_loads += 1
                slot = better[0] if source else []  # a refused state leaves the slot empty
        if source is None and self.disk is not None:
            # what the save pushed out of RAM goes to disk first: it may be this very conversation's state
            self._spill_all(evicted)
            evicted = []
            found = self._from_disk(slot, prompt)
            if found is not None and load(found[0], found[1]):
                source, restored, slot = "disk", found[2], found[0]
                self._disk_loads += 1
        if ram is not None:
            evicted += ram.update()
        self._spill_all(evicted)
        if source is not None:
            self._swaps += 1
            log.info("cache.load", source=source, n_tokens=len(slot), nbytes=restored)
        return Swap(source, saved, restored)

    def _update_longest(
        self,
        rule: LookupRule[S],
        slot: list[int],
        prompt: Sequence[int],
        slot_kept: int,
        nbytes: Callable[[], int],
        snapshot: Callable[[], S],
        load: Callable[[list[int], S], bool],
    ) -> Swap:
        """turnstile's rule: load the state (RAM or disk) that keeps the most of `prompt`, if its gain over the
        slot pays for the load (`rule.choose`); save the slot first if what it would lose pays for the copy."""
        ram, disk = self.ram, self.disk
        entries = ram.entries if ram is not None else ()
        cands = [
            Candidate("ram", rule.kept(e.tokens, e.state, n), e.tokens, e.nbytes, i)
            for i, e in enumerate(entries)
            if (n := lcp(e.tokens, prompt)) > slot_kept
        ]
        choice = rule.choose(slot_kept, len(prompt), cands)
        if disk is not None:  # the index answers without reading a state
            peek = disk.peek(prompt, better_than=choice.kept if choice is not None else slot_kept)
            if peek is not None:
                on_disk = Candidate("disk", rule.kept(peek[1], None, peek[0]), peek[1], peek[2])
                choice = rule.choose(slot_kept, len(prompt), [c for c in (choice, on_disk) if c is not None])
        lost = len(slot) - (lcp(slot, choice.tokens) if choice is not None else slot_kept)
        saved = restored = 0
        evicted: list[Entry[S]] = []
        taken = False
        if choice is not None and choice.tier == "ram" and ram is not None and ram.counts_held:
            entry = entries[choice.index]
            if lcp(entry.tokens, prompt) == len(entry.tokens) and lcp(entry.tokens, slot) < len(slot):
                # it leaves RAM with this load: out before the save, so that no other entry goes for its bytes
                ram.take(entry, keep=False)
                taken = True
        if lost > 0 and rule.worth_saving(lost, size := nbytes()):
            snap = _once(snapshot)  # a state too large for RAM is spilled without a second copy
            if ram is not None:
                if ram.save(slot, size, snap, self.owner):
                    saved = size
                    log.debug("cache.save", n_tokens=len(slot), nbytes=size)
                evicted += ram.drain_evicted()
            if not saved and disk is not None and (ram is None or 0 < ram.limit_bytes < size):
                saved = self._spill(slot, snap())  # too large for RAM (or no RAM cache): the disk keeps it
        source: Literal["ram", "disk"] | None = None
        if choice is not None and choice.tier == "ram" and ram is not None:
            entry = entries[choice.index]
            if not taken:
                ram.take(entry, keep=lcp(entry.tokens, prompt) < len(entry.tokens))  # a partial use keeps it
            if load(list(entry.tokens), entry.state):
                source, restored, slot = "ram", self.codec.nbytes(entry.state), list(entry.tokens)
                self._ram_loads += 1
        elif choice is not None and disk is not None:
            self._spill_all(evicted)  # what the save pushed out of RAM goes to disk first
            evicted = []
            found = self._read_disk(prompt, choice.kept - 1)
            if found is not None and load(found[0], found[1]):
                source, restored, slot = "disk", found[2], found[0]
                self._disk_loads += 1
        if ram is not None:
            evicted += ram.update()
            ram.tick()
        self._spill_all(evicted)
        if source is not None:
            self._swaps += 1
            log.info("cache.load", source=source, n_tokens=len(slot), nbytes=restored)
        return Swap(source, saved, restored)

    def _read_disk(
        self, prompt: Sequence[int], better_than: int, accept: Callable[[list[int]], bool] | None = None
    ) -> tuple[list[int], S, int] | None:
        """The disk tier's state that keeps the most of `prompt` (more than `better_than`), decoded, if
        `accept` (given its tokens) takes it."""
        assert self.disk is not None
        found = self.disk.find(prompt, better_than=better_than)
        if found is None or (accept is not None and not accept(found[0])):
            return None
        tokens, data = found
        try:
            state = self.codec.decode(data)
        except ValueError as e:  # msgspec.DecodeError is a ValueError
            log.warning("cache.disk_state_undecodable", n_tokens=len(tokens), error=str(e))
            self.disk.remove(tokens)
            return None
        return tokens, state, len(data)

    def _from_disk(self, slot: list[int], prompt: Sequence[int]) -> tuple[list[int], S, int] | None:
        """The disk tier's best state for `prompt` if it beats the slot (llama-server's load rule)."""
        assert self.disk is not None
        return self._read_disk(prompt, lcp(slot, prompt), lambda tokens: pick_better([tokens], slot, prompt) == 0)

    def _spill(self, tokens: Sequence[int], state: S, owner: str | None = None) -> int:
        """Write a state to the disk tier as `owner`'s (None: the slot's); the bytes written (0: no tier, empty,
        or refused)."""
        if self.disk is None or not tokens:
            return 0
        parts = self.codec.encode(state)
        if not self.disk.put(tokens, parts, owner=self.owner if owner is None else owner):
            return 0
        self._spilled += 1
        self._disk_keys.add(hash(tuple(tokens)))
        return sum(len(p) for p in parts)

    def _spill_all(self, entries: Sequence[Entry[S]]) -> int:
        return sum(self._spill(e.tokens, e.state, e.owner) for e in entries)

    # --- lifetime ---------------------------------------------------------------------------------

    def flush(self, slot: Sequence[int], snapshot: Callable[[], S]) -> int:
        """Write every RAM entry and the slot's own state to the disk tier (on close); bytes written."""
        if self.disk is None:
            return 0
        n = self._spill_all(list(self.ram.entries)) if self.ram is not None else 0
        if slot:
            n += self._spill(slot, snapshot())
        log.info("cache.flush", nbytes=n)
        return n

    # --- questions --------------------------------------------------------------------------------

    def where(self, key: int) -> Location:
        """Where the state whose tokens hash to `key` is: RAM, disk (written by this process), or none."""
        if self.ram is not None:
            version = self.ram.version
            if self._ram_keys[0] != version:  # rebuilt once per change, not once per question
                self._ram_keys = (version, frozenset(hash(e.tokens) for e in self.ram.entries))
            if key in self._ram_keys[1]:
                return "ram"
        return "disk" if key in self._disk_keys else "none"

    def stats(self) -> TieredCacheStats:
        ram = self.ram
        return TieredCacheStats(
            swaps=self._swaps,
            ram_loads=self._ram_loads,
            disk_loads=self._disk_loads,
            ram_entries=len(ram) if ram is not None else 0,
            ram_bytes=ram.nbytes if ram is not None else 0,
            spilled=self._spilled,
        )


def _once(fn: Callable[[], S]) -> Callable[[], S]:
    """`fn`, called at most once: later calls return its first result."""
    done: list[S] = []

    def call() -> S:
        if not done:
            done.append(fn())
        return done[0]

    return call
