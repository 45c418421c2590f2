"""The tiered cache: llama-server's RAM prompt cache, and behind it an optional disk tier.

It owns what happens to slot states between requests: when the slot is saved (llama-server's rules),
which cached state replaces it (RAM first, then disk), what spills to disk (every state that leaves RAM,
and a state too large for RAM), what is written on close, and where a conversation's state is now (for
the scheduler's affinity policy). The slot keeps only the sequence mechanics. Once per request the data
flows one way, in three steps, and nothing calls back into the slot:

    plan = cache.plan(slot.tokens, prompt, slot.nbytes)     # a frozen CachePlan: save? load what, from where?
    state = slot.snapshot() if plan.save and plan.save.needs_state else None
    fetched = cache.apply(plan, state)                      # stores, evicts, spills; the state to load
    swap = cache.loaded(fetched, slot.load(fetched))        # counts the load the slot made (or refused)

(vLLM's `KVCacheBlocks` and SGLang's `MatchResult` hand the scheduler a result in the same way.) Generic
over the state type `S`; the disk tier stores `codec.encode(state)` bytes.

Synchronous and not thread-safe: the slot's worker thread is its only caller (`where` reads a snapshot
that is rebuilt only when the entries changed, so the event loop may call it between requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

import msgspec

from caches.disk.format import Buffer
from caches.disk.tier import DiskTier
from caches.prompt_cache import Entry, PromptCache, pick_better
from caches.tokens import lcp
from runtime.log import get_logger

__all__ = [
    "CachePlan",
    "Candidate",
    "Fetched",
    "Load",
    "Location",
    "LookupRule",
    "Save",
    "StateCodec",
    "Swap",
    "TieredCache",
    "TieredCacheStats",
]

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
class Save:
    """Save the slot's state (`tokens`, `nbytes`) before anything replaces it (the RAM cache's rules may still
    skip it: an entry holds it whole, or it is too large; then `needs_state` is False)."""

    tokens: tuple[int, ...]
    nbytes: int
    to_ram: bool
    """It becomes the RAM cache's newest entry (`plan_save` said so)."""
    spill: bool
    """Else it is written to the disk tier (too large for RAM, or no RAM cache)."""

    @property
    def needs_state(self) -> bool:
        """Whether the slot's state is stored anywhere (so the slot copies it)."""
        return self.to_ram or self.spill


@dataclass(frozen=True, slots=True)
class Load(Generic[S]):
    """Replace the slot's state with a cached one from `tier`."""

    tier: Literal["ram", "disk"]
    kept: int
    """Prompt tokens prefix reuse keeps of it, as the plan sees them (a disk read decides its own)."""
    entry: Entry[S] | None = None
    """RAM: the entry, its state in hand (still loaded if the save evicts it meanwhile)."""
    leaves_ram: bool = True
    """RAM: the entry leaves the cache; else it stays, marked used (a prompt that uses it only in part)."""
    early: bool = False
    """RAM, with the limits counting held bytes: it leaves before the save, so no other entry goes for its bytes."""
    better_than: int = 0
    """Disk: the tier's best state for `prompt` keeping more than this many tokens, found when read."""
    prompt: tuple[int, ...] = ()
    beats_slot: tuple[int, ...] | None = None
    """Disk, llama-server's rule: read only if it beats this slot (`pick_better`)."""


@dataclass(frozen=True, slots=True)
class CachePlan(Generic[S]):
    """What one request does to the slot's state, decided before anything changes (`TieredCache.plan`).

    The slot carries it out: it snapshots its state if `save` is set, hands it to `TieredCache.apply` (which
    stores it and gives back the state to load, if any), loads that and reports with `TieredCache.loaded`.
    Nothing calls back into the slot."""

    save: Save | None
    load: Load[S] | None
    n_prompt: int
    kept: int
    """Prompt tokens the plan keeps (of the state it loads, else of the slot); the last one is never kept."""

    @property
    def evaluate(self) -> int:
        """Prompt tokens left to evaluate."""
        return self.n_prompt - self.kept


@dataclass(frozen=True, slots=True)
class Fetched(Generic[S]):
    """What `apply` did: the bytes of the slot's state it stored, and the state to load (None: keep the slot)."""

    saved: int
    tier: Literal["ram", "disk"] | None = None
    tokens: tuple[int, ...] = ()
    state: S | None = None
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class Swap:
    """What one request's cache step did: where a loaded state came from (None: the slot was kept) and the
    bytes moved."""

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
        """`lookup` None: llama-server's prompt cache update (`plan`); a rule: turnstile's longest-state lookup."""
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

    # --- one request: plan, apply, loaded ----------------------------------------------------------

    def plan(
        self, slot: Sequence[int], prompt: Sequence[int], slot_nbytes: int, *, slot_kept: int | None = None
    ) -> CachePlan[S]:
        """Decide what a request for `prompt` does to the slot's state (changes nothing).

        `slot`: the slot's tokens; `slot_nbytes`: its state's size (state and checkpoints); `slot_kept`: what
        prefix reuse keeps of it (default: the common prefix). Without a `lookup` rule, llama-server's prompt
        cache update with the disk tier behind RAM; with one, turnstile's longest-state lookup.
        """
        slot, n_prompt = tuple(slot), len(prompt)
        kept = lcp(slot, prompt) if slot_kept is None else slot_kept
        if self.lookup is not None:
            return self._plan_longest(self.lookup, slot, prompt, kept, slot_nbytes)
        if not PromptCache.wants_update(slot, prompt, self.similarity):
            return CachePlan(None, None, n_prompt, _cap(kept, n_prompt))
        save, gone = self._plan_save(slot, slot_nbytes)
        load: Load[S] | None = None
        if self.ram is not None:
            # llama-server saves first, then loads: from the entries the save leaves (not those the slot holds
            # whole, which never beat it)
            alive = [e for e in self.ram.entries if not any(e is g for g in gone)]
            i = pick_better([e.tokens for e in alive], slot, prompt)
            if i is not None:
                entry = alive[i]
                n = lcp(entry.tokens, prompt)
                load = Load("ram", n, entry, leaves_ram=not (self.retain_partial and n < len(entry.tokens)))
        if load is None and self.disk is not None:
            load = Load("disk", kept, better_than=lcp(slot, prompt), beats_slot=slot, prompt=tuple(prompt))
        return CachePlan(save, load, n_prompt, _cap(load.kept if load is not None else kept, n_prompt))

    def _plan_longest(
        self, rule: LookupRule[S], slot: tuple[int, ...], prompt: Sequence[int], slot_kept: int, slot_nbytes: int
    ) -> CachePlan[S]:
        """turnstile's rule: load the state (RAM or disk) that keeps the most of `prompt`, if its gain over the
        slot pays for the load (`rule.choose`); save the slot first if what it would lose pays for the copy."""
        ram, disk, n_prompt = self.ram, self.disk, len(prompt)
        entries = ram.entries if ram is not None else ()
        cands = [
            Candidate("ram", rule.kept(e.tokens, e.state, n), e.tokens, e.nbytes, i)
            for i, e in enumerate(entries)
            if (n := lcp(e.tokens, prompt)) > slot_kept
        ]
        choice = rule.choose(slot_kept, n_prompt, cands)
        if disk is not None:  # the index answers without reading a state
            peek = disk.peek(prompt, better_than=choice.kept if choice is not None else slot_kept)
            if peek is not None:
                on_disk = Candidate("disk", rule.kept(peek[1], None, peek[0]), peek[1], peek[2])
                choice = rule.choose(slot_kept, n_prompt, [c for c in (choice, on_disk) if c is not None])
        load: Load[S] | None = None
        if choice is not None and choice.tier == "ram":
            entry = entries[choice.index]
            whole = lcp(entry.tokens, prompt) == len(entry.tokens)  # else a partial use keeps it cached
            # it leaves RAM with this load: out before the save, so that no other entry goes for its bytes
            early = ram is not None and ram.counts_held and whole and lcp(entry.tokens, slot) < len(slot)
            load = Load("ram", choice.kept, entry, leaves_ram=whole, early=early)
        elif choice is not None:
            load = Load("disk", choice.kept, better_than=choice.kept - 1, prompt=tuple(prompt))
        lost = len(slot) - (lcp(slot, choice.tokens) if choice is not None else slot_kept)
        worth = lost > 0 and rule.worth_saving(lost, slot_nbytes)
        early_out = load.entry if load is not None and load.early else None
        save = self._plan_save(slot, slot_nbytes, early_out)[0] if worth else None
        return CachePlan(save, load, n_prompt, _cap(choice.kept if choice is not None else slot_kept, n_prompt))

    def _plan_save(
        self, slot: tuple[int, ...], nbytes: int, without: Entry[S] | None = None
    ) -> tuple[Save | None, tuple[Entry[S], ...]]:
        """Where the slot's state goes if it is saved: RAM (as `PromptCache.plan_store` says, `without` an entry
        that leaves first), else the disk tier when it is too large for RAM (or there is no RAM cache); None for
        an empty slot. Also the RAM entries that saving it evicts for room."""
        if not slot:
            return None, ()
        ram, to_ram = self.ram, False
        evicts: tuple[Entry[S], ...] = ()
        if ram is not None:
            plan, evicts = ram.plan_store(slot, nbytes, without, self.owner)
            to_ram = plan.store
        spill = not to_ram and self.disk is not None and (ram is None or 0 < ram.limit_bytes < nbytes)
        return Save(slot, nbytes, to_ram, spill), evicts

    def apply(self, plan: CachePlan[S], state: S | None) -> Fetched[S]:
        """Carry out the cache's side of `plan`: store `state` (the slot's copy when `plan.save` needs one; None:
        it could not be copied), evict and spill, and hand back the state for the slot to load."""
        ram, load = self.ram, plan.load
        evicted: list[Entry[S]] = []
        if load is not None and load.early and load.entry is not None and ram is not None:
            ram.take(load.entry, keep=False)
        saved = 0
        if plan.save is not None:
            saved = self._store(plan.save, state, evicted)
        out: Fetched[S] = Fetched(saved)
        if load is not None and load.entry is not None:
            entry = load.entry
            if not load.early and ram is not None:
                ram.take(entry, keep=not load.leaves_ram)
            out = Fetched(saved, "ram", entry.tokens, entry.state, self.codec.nbytes(entry.state))
        elif load is not None and self.disk is not None:
            self._spill_all(evicted)  # what the save pushed out of RAM goes to disk first: it may be this one
            evicted = []
            found = self._read_disk(load)
            if found is not None:
                out = Fetched(saved, "disk", *found)
        if ram is not None:
            evicted += ram.update()
            if self.lookup is not None:
                ram.tick()
        self._spill_all(evicted)
        return out

    def loaded(self, fetched: Fetched[S], ok: bool) -> Swap:
        """Count what the slot did with `fetched` (`ok`: its state is now the slot's; False: refused, the slot
        is empty)."""
        source = fetched.tier if ok else None
        if source is not None:
            self._swaps += 1
            if source == "ram":
                self._ram_loads += 1
            else:
                self._disk_loads += 1
            log.info("cache.load", source=source, n_tokens=len(fetched.tokens), nbytes=fetched.nbytes)
        return Swap(source, fetched.saved, fetched.nbytes if source is not None else 0)

    def _store(self, save: Save, state: S | None, evicted: list[Entry[S]]) -> int:
        """Store the slot's state in RAM (what that evicts is added to `evicted`), or spill it; the bytes stored."""
        saved, ram = 0, self.ram
        if ram is not None:
            if ram.save(save.tokens, save.nbytes, lambda: _copied(state), self.owner):
                saved = save.nbytes
                log.debug("cache.save", n_tokens=len(save.tokens), nbytes=save.nbytes)
            evicted += ram.drain_evicted()
        if not saved and save.spill and state is not None:
            saved = self._spill(save.tokens, state)  # too large for RAM (or no RAM cache): the disk keeps it
        return saved

    def _read_disk(self, load: Load[S]) -> tuple[tuple[int, ...], S, int] | None:
        """The disk tier's state that keeps the most of the prompt (more than `load.better_than`), decoded, if
        it beats `load.beats_slot` (when set)."""
        assert self.disk is not None
        prompt, slot = load.prompt, load.beats_slot
        found = self.disk.find(prompt, better_than=load.better_than)
        if found is None or (slot is not None and pick_better([found[0]], slot, prompt) != 0):
            return None
        tokens, data = found
        try:
            state = self.codec.decode(data)
        except ValueError as e:  # msgspec.DecodeError is a ValueError
            log.warning("cache.disk_state_undecodable", n_tokens=len(tokens), error=str(e))
            self.disk.remove(tokens)
            return None
        return tuple(tokens), state, len(data)

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

    def keep(self, slot: Sequence[int], nbytes: int, state: S) -> int:
        """Keep the slot's state before the slot takes one from elsewhere (a restored slot file): in RAM, or on
        disk when RAM is off or too small for it; what RAM evicts for it spills to disk. `state`: the slot's
        copy, `nbytes` its size. Bytes saved."""
        if not slot:
            return 0
        evicted: list[Entry[S]] = []
        # a request's save, but one the disk always takes when RAM does not (the slot is about to be replaced)
        saved = self._store(Save(tuple(slot), nbytes, self.ram is not None, spill=True), state, evicted)
        if self.ram is not None:
            evicted += self.ram.update()
        self._spill_all(evicted)
        log.debug("cache.keep", n_tokens=len(slot), nbytes=saved)
        return saved

    # --- lifetime ---------------------------------------------------------------------------------

    @property
    def keeps_on_close(self) -> bool:
        """Whether `flush` writes anything (there is a disk tier): the slot copies its state only then."""
        return self.disk is not None

    def flush(self, slot: Sequence[int], state: S | None) -> int:
        """Write every RAM entry and the slot's own state (`slot`'s tokens) to the disk tier (on close); bytes
        written."""
        if self.disk is None:
            return 0
        n = self._spill_all(list(self.ram.entries)) if self.ram is not None else 0
        if slot and state is not None:
            n += self._spill(slot, state)
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


def _cap(kept: int, n_prompt: int) -> int:
    """Prompt tokens kept, at most all but the last (always evaluated, for its logits)."""
    return max(0, min(kept, n_prompt - 1))


def _copied(state: S | None) -> S:
    """The slot's copy of its state; None: the copy failed for memory (the RAM cache then shrinks its limit)."""
    if state is None:
        raise MemoryError("the slot's state could not be copied")
    return state
