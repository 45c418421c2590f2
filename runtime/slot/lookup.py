"""turnstile's lookup rule (`cache_rules="turnstile"`): every turn takes the longest usable state any tier holds.

llama-server consults its prompt cache only when the slot would keep under half of its own tokens; with
agents sharing a long system prompt the slot always "matches" through that prompt, and each agent's own
history after it is recomputed although its state is cached. Here every turn looks at every tier (the slot,
the RAM entries, the disk index, which answers without reading a state) and loads the candidate that keeps
the most tokens of the prompt, if what it keeps beyond the slot is worth more prefill time than the load
costs; before the slot's state is replaced or truncated it is saved, if what would be lost is worth more
prefill time than the copy costs (`cost.worth_saving`).

The costs are measured, not guessed (`python -m benchmarks lookup-cost`, SmolLM2-135M-Instruct Q4_1,
2 threads, n_batch 2048, n_ubatch 512, flash attention, on this project's 2-core machine, 2026-12-01):

- prefill: 5.12 ms per token for 64 tokens after a 1,500-token context (5.06 at 256; 8.9 at 16);
- load: `state_set` from RAM 5.3 GB/s, from shared blocks (`BlockStore.get` + `state_set`) 4.5 GB/s, from
  the disk tier (`find` + decode + `state_set`, the file in the page cache) 2.25 GB/s + 0.69 ms;
- save: `state_get` copied out 1.57 GB/s (fitted over 256-, 1,500- and 3,000-token states).

So on SmolLM2 one prefilled token costs as much as loading 23 MB from RAM or 11.5 MB from disk: about
500 tokens' worth of its KV (23 KB a token). The rule uses the slower RAM figure (blocks) for RAM. On a larger
model prefill per token grows faster than KV bytes per token (an 8B model holds ~6x SmolLM2's KV per token
but prefills ~50x slower), so these constants, if anything, underrate a load elsewhere: the rule then skips
only loads that would gain a handful of tokens. `LoadCost` takes other figures.

A state the prompt does not continue whole (another conversation's) counts only when what it keeps is at least
`min_shared_prefix` tokens (`runtime.cache_rules`; 32 under turnstile's rules, 0 under llama-server's): a few shared
chat-template tokens are not worth a load, nor the reply's dependence on which conversation ran before it.

Pure and synchronous: `choose` and `usable` are functions of their inputs (tested without a model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from caches.tiered import Candidate
from runtime.slot.shared import AnyState
from runtime.slot.state import Checkpoint

__all__ = ["MEASURED", "LoadCost", "TurnstileLookup", "choose", "usable"]


@dataclass(frozen=True, slots=True)
class LoadCost:
    """Seconds a prefilled token, a load and a save take (defaults: measured on SmolLM2, module doc)."""

    prefill_s_per_token: float = 5.12e-3
    ram_bytes_per_s: float = 4.48e9
    ram_fixed_s: float = 0.0
    disk_bytes_per_s: float = 2.25e9
    disk_fixed_s: float = 0.69e-3
    save_bytes_per_s: float = 1.57e9

    def load_seconds(self, tier: str, nbytes: int) -> float:
        if tier == "ram":
            return self.ram_fixed_s + nbytes / self.ram_bytes_per_s
        return self.disk_fixed_s + nbytes / self.disk_bytes_per_s

    def worth_loading(self, gain: int, tier: str, nbytes: int) -> bool:
        """Whether `gain` tokens more than the slot keeps pay for loading `nbytes` from `tier`."""
        return gain > 0 and gain * self.prefill_s_per_token > self.load_seconds(tier, nbytes)

    def worth_saving(self, lost: int, nbytes: int) -> bool:
        """Whether `lost` tokens the slot would drop pay for copying its `nbytes` state out."""
        return lost > 0 and lost * self.prefill_s_per_token > nbytes / self.save_bytes_per_s


MEASURED = LoadCost()


def usable(
    n_lcp: int, n_tokens: int, checkpoints: Sequence[Checkpoint], can_truncate: bool, min_shared: int = 0
) -> int:
    """Tokens of a state (of `n_tokens`, sharing `n_lcp` with the prompt) that prefix reuse can keep.

    A transformer KV cache drops any suffix; a memory that cannot (recurrent, hybrid, SWA) keeps all of
    itself only if the prompt continues it whole, otherwise at most its newest checkpoint at or below the
    common prefix (an estimate: the slot's `find_restore` also checks positions), else nothing.
    `min_shared` (turnstile's `min_shared_prefix`): a state the prompt does not continue whole (another
    conversation's) gives nothing unless what it keeps is at least that long.
    """
    if n_lcp >= n_tokens:
        return n_lcp
    kept = n_lcp if can_truncate else max((c.n_tokens for c in checkpoints if c.n_tokens <= n_lcp), default=0)
    return kept if kept >= min_shared else 0


def choose(slot_kept: int, n_prompt: int, candidates: Sequence[Candidate], cost: LoadCost) -> Candidate | None:
    """The candidate to load instead of keeping the slot, or None.

    The one that keeps the most of the prompt (the last prompt token is always evaluated, so kept counts
    stop at n_prompt - 1) among those whose gain over the slot is worth its load; among equals, RAM before
    disk, then the fewest bytes, then the earliest given.
    """
    cap = max(0, n_prompt - 1)
    base = min(slot_kept, cap)
    best: Candidate | None = None
    best_key: tuple[int, int, int] | None = None
    for c in candidates:
        kept = min(c.kept, cap)
        if not cost.worth_loading(kept - base, c.tier, c.nbytes):
            continue
        key = (-kept, 0 if c.tier == "ram" else 1, c.nbytes)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best


class TurnstileLookup:
    """The rule as `caches.tiered.LookupRule` for one slot's memory (`can_truncate`: a transformer KV cache)."""

    def __init__(self, cost: LoadCost = MEASURED, *, can_truncate: bool = True, min_shared: int = 0) -> None:
        """`min_shared`: the rules' `min_shared_prefix` (`usable`)."""
        self.cost = cost
        self.can_truncate = can_truncate
        self.min_shared = min_shared

    def kept(self, tokens: tuple[int, ...], state: AnyState | None, n_lcp: int) -> int:
        # a state on disk is not read to decide: its checkpoints are taken to cover what it shares
        checkpoints = state.checkpoints if state is not None else ()
        return usable(n_lcp, len(tokens), checkpoints, self.can_truncate or state is None, self.min_shared)

    def choose(self, slot_kept: int, n_prompt: int, candidates: Sequence[Candidate]) -> Candidate | None:
        return choose(slot_kept, n_prompt, candidates, self.cost)

    def worth_saving(self, lost: int, nbytes: int) -> bool:
        return self.cost.worth_saving(lost, nbytes)
