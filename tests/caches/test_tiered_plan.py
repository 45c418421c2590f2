"""The tiered cache's plan at the slot seam (`caches/tiered.py`), model-free: `plan` decides and changes nothing,
`apply` stores, evicts, spills and hands back the state to load, `loaded` counts what the slot did with it.

States are strings here (a codec of their UTF-8 bytes, weighing their length); the disk tier is a real one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from caches.disk.tier import DiskTier
from caches.prompt_cache import PromptCache
from caches.tiered import CachePlan, Load, Save, Swap, TieredCache


class Text:
    """A codec for string states."""

    def encode(self, state: str) -> Sequence[bytes]:
        return [state.encode()]

    def decode(self, data: memoryview) -> str:
        return bytes(data).decode()

    def nbytes(self, state: str) -> int:
        return len(state)


A = tuple(range(1, 41))  # conversation A's state: 40 tokens
B = tuple(range(100, 141))  # the slot: conversation B, 41 tokens
NEXT_A = [*A, 900, 901]  # A's next prompt


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[DiskTier]:
    with DiskTier(tmp_path / "tier", fingerprint="test") as tier:
        yield tier


def server_rules(ram: PromptCache[str] | None, disk: DiskTier | None = None) -> TieredCache[str]:
    return TieredCache(ram, disk, Text(), retain_partial=False)  # llama-server's rules: no lookup rule


def test_the_plan_saves_the_slot_loads_the_better_ram_entry_and_changes_nothing() -> None:
    ram: PromptCache[str] = PromptCache(0, 0)
    ram.save(A, 400, lambda: "state A")
    cache = server_rules(ram)
    version = ram.version

    plan = cache.plan(B, NEXT_A, 410)

    assert plan.save == Save(B, 410, to_ram=True, spill=False)
    assert plan.load is not None and (plan.load.tier, plan.load.kept, plan.load.leaves_ram) == ("ram", 40, True)
    assert (plan.kept, plan.evaluate) == (40, 2)
    assert (ram.version, [e.tokens for e in ram.entries]) == (version, [A])  # nothing changed yet

    fetched = cache.apply(plan, "state B")
    assert (fetched.tier, fetched.tokens, fetched.state, fetched.saved) == ("ram", A, "state A", 410)
    assert [(e.tokens, e.state) for e in ram.entries] == [(B, "state B")]  # A left RAM with its load

    assert cache.loaded(fetched, True) == Swap("ram", 410, len("state A"))
    stats = cache.stats()
    assert (stats.swaps, stats.ram_loads, stats.disk_loads) == (1, 1, 0)


def test_a_refused_load_is_not_counted() -> None:
    ram: PromptCache[str] = PromptCache(0, 0)
    ram.save(A, 400, lambda: "state A")
    cache = server_rules(ram)
    fetched = cache.apply(cache.plan(B, NEXT_A, 410), "state B")
    assert cache.loaded(fetched, False) == Swap(None, 410, 0)
    assert (cache.stats().swaps, cache.stats().ram_loads) == (0, 0)


def test_a_slot_the_prompt_continues_plans_nothing() -> None:
    cache = server_rules(PromptCache(0, 0))
    plan = cache.plan(A, NEXT_A, 400)
    assert plan == CachePlan(None, None, len(NEXT_A), 40)
    assert cache.apply(plan, None).tier is None


def test_the_save_that_evicts_the_wanted_entry_is_foreseen_and_the_load_comes_from_disk(disk: DiskTier) -> None:
    """llama-server's order: the slot is saved first, its room made by evicting the oldest entry, which is the one
    the prompt wants; the plan loads it from disk, where the eviction spills it before the read."""
    ram: PromptCache[str] = PromptCache(500, 0)  # room for one state
    ram.save(A, 400, lambda: "state A")
    cache = server_rules(ram, disk)

    plan = cache.plan(B, NEXT_A, 410)

    assert plan.save == Save(B, 410, to_ram=True, spill=False)
    assert plan.load == Load("disk", 0, better_than=0, beats_slot=B, prompt=tuple(NEXT_A))
    assert len(disk) == 0  # nothing spilled yet

    fetched = cache.apply(plan, "state B")
    assert (fetched.tier, fetched.tokens, fetched.state) == ("disk", A, "state A")
    assert [e.tokens for e in ram.entries] == [B]
    assert cache.loaded(fetched, True).source == "disk"
    assert cache.stats().disk_loads == 1


def test_a_state_too_large_for_ram_is_spilled_without_a_ram_entry(disk: DiskTier) -> None:
    ram: PromptCache[str] = PromptCache(100, 0)
    cache = server_rules(ram, disk)
    plan = cache.plan(B, NEXT_A, 410)
    assert plan.save == Save(B, 410, to_ram=False, spill=True)
    assert plan.save.needs_state
    fetched = cache.apply(plan, "state B")
    assert fetched.saved > 0 and len(ram) == 0 and cache.where(hash(B)) == "disk"


def test_a_slot_an_entry_holds_whole_needs_no_copy() -> None:
    ram: PromptCache[str] = PromptCache(0, 0)
    ram.save(B, 410, lambda: "state B")
    cache = server_rules(ram)
    plan = cache.plan(B, NEXT_A, 410)
    assert plan.save is not None and not plan.save.needs_state  # the slot does not copy its state
    assert cache.apply(plan, None).saved == 0
