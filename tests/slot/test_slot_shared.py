"""The slot with its RAM prompt cache holding states as shared blocks (`Slot(shared_blocks=B)`).

Agents that share a system prompt play round robin through two slots on the same model, one holding whole
copies and one shared blocks: every turn is the same (tokens, cached and prefilled counts, where the state
came from) under both cache rules, the RAM cache takes the same decisions on the same (whole) sizes, and
the block store holds exactly the states the RAM cache holds, in fewer bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from caches.disk.tier import DiskTier
from runtime.backend.protocol import SlotRequest
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.slot.executor import Slot
from runtime.slot.shared import SharedSlotState
from runtime.types import CacheRules
from sessions import Sampling

CFG = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=64, n_batch=256)
SYSTEM = "You are a helpful assistant for the lighthouse crew. Keep answers short and kind. " * 3
TOPICS = ["the sea", "a red ship", "the moon and the stars", "code and tests"]
GREEDY = Sampling(temperature=0.0).with_overrides(max_tokens=8)


def _play(
    eng: Engine,
    slot: Slot,
    n_agents: int,
    n_turns: int,
    system: str = SYSTEM,
    after: Callable[[], None] = lambda: None,
) -> list[tuple[Any, ...]]:
    histories: list[list[dict[str, str]]] = [[] for _ in range(n_agents)]
    out: list[tuple[Any, ...]] = []
    for t in range(n_turns):
        for a in range(n_agents):
            user = f"I am agent {a}. Turn {t}: tell me more about {TOPICS[a % len(TOPICS)]}, please."
            msgs = [{"role": "system", "content": system}, *histories[a], {"role": "user", "content": user}]
            r = eng.render(msgs)
            res = slot.run(SlotRequest(prompt=r.tokens, sampling=GREEDY, user_starts=r.user_starts))
            out.append((a, t, res.tokens, res.cached_tokens, res.prefilled_tokens, res.cache_source))
            histories[a] += [{"role": "user", "content": user}, {"role": "assistant", "content": res.text}]
            after()
    return out


@pytest.mark.parametrize(
    ("rules", "arch", "limit"),
    [
        ("turnstile", "llama", 0),
        ("turnstile", "gemma3", 0),
        ("turnstile", "jamba", 0),
        ("llama-server", "llama", 0),
        ("llama-server", "llama", 300_000),  # whole sizes against the limit: llama-server's evictions
        ("llama-server", "gemma3", 0),
        ("llama-server", "jamba", 0),
    ],
)
def test_shared_blocks_change_no_turn_and_hold_less(
    arch: str, limit: int, rules: CacheRules, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    runs = []
    slots = []
    for shared in (None, 8):
        eng = make_engine(tiny_models[arch], CFG)
        slot = Slot(eng, cache_ram_bytes=limit, cache_rules=rules, shared_blocks=shared)
        if slot.blocks is not None:
            slot.blocks.verify = True  # compare every block found held with the new state's own bytes
        runs.append(_play(eng, slot, 4, 4))
        slots.append(slot)
    whole, shared_slot = slots
    assert runs[1] == runs[0]
    assert whole.cache.ram is not None and shared_slot.cache.ram is not None
    if limit:  # entries were evicted (and their blocks freed, below)
        assert whole.cache.ram.stats().evictions > 0
    else:  # the RAM cache served turns
        assert whole.cache.ram.stats().hits >= 3
    assert shared_slot.cache.ram.stats() == whole.cache.ram.stats()  # same decisions, same (whole) sizes
    assert whole.blocks is None and shared_slot.blocks is not None
    entries = shared_slot.cache.ram.entries
    held = [e.state for e in entries if isinstance(e.state, SharedSlotState)]
    assert len(held) == len(entries) > 1  # every RAM entry is held as blocks
    st = shared_slot.blocks.stats()
    assert st.states == len(held)  # entries that left the cache left the store
    assert st.logical_bytes == sum(s.ref.size for s in held)
    assert st.blocks_shared > 0 and st.stored_bytes < st.logical_bytes
    assert st.whole_states == 0  # every state cut
    if rules == "llama-server" or arch == "llama":
        assert st.diverged == 0  # shared blocks were byte-identical
    # (turnstile's rule also saves a slot a checkpoint model rolled back: the cells between the checkpoint and
    # the common prefix were evaluated again, in another batch, and may differ in the last bits; the block
    # first stored serves them, as `caches.blocks` says, and the turns above are still the same)
    cps = sum(c.nbytes for s in held for c in s.checkpoints)
    a, b = whole.stats(), shared_slot.stats()
    assert a.ram_held_bytes == a.ram_bytes == b.ram_bytes
    assert b.ram_held_bytes == st.stored_bytes + cps < b.ram_bytes


@pytest.mark.parametrize("arch", ["llama", "jamba"])
def test_shared_states_spill_to_disk_whole_and_come_back(
    arch: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    """RAM for about one state, a disk tier behind it: shared states are assembled on their way to disk,
    and the turns are those of whole copies."""
    runs = []
    disks = []
    for shared in (None, 8):
        eng = make_engine(tiny_models[arch], CFG)
        disk = DiskTier(tmp_path / f"disk-{shared}", fingerprint=eng.fingerprint, settings=eng.settings_key)
        disks.append(disk)
        slot = Slot(eng, cache_ram_bytes=1, disk=disk, shared_blocks=shared)
        runs.append(_play(eng, slot, 3, 3, system="Be brief."))  # a short prefix: every turn swaps
        assert slot.stats().disk_loads >= 3
        slot.flush()
    assert runs[1] == runs[0]
    assert sum(1 for r in runs[0] if r[5] in ("disk", "checkpoint")) >= 3
    a, b = (d.stats() for d in disks)
    assert (a.entries, a.bytes) == (b.entries, b.bytes)  # the same whole states on disk
    for d in disks:
        d.close()


@pytest.mark.parametrize("arch", ["llama", "jamba"])
def test_under_turnstile_rules_the_limit_counts_shared_blocks_once(
    arch: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    """Four conversations, a RAM limit of about two whole states: with shared blocks it holds more of them
    (never more bytes than the limit), so more turns come from RAM and fewer tokens are prefilled. (Under
    the lookup rule the slot and the entry being loaded hold two more: three conversations would all fit.)"""
    limit = 360_000  # jamba: its states hold a checkpoint at the end of each prompt too (turnstile rules)
    n_agents = 4
    runs, slots = [], []
    for shared in (None, 8):
        eng = make_engine(tiny_models[arch], CFG)
        slot = Slot(eng, cache_ram_bytes=limit, cache_rules="turnstile", shared_blocks=shared)
        held: list[int] = []

        def record(slot: Slot = slot, held: list[int] = held) -> None:
            held.append(slot.stats().ram_held_bytes)

        runs.append(_play(eng, slot, n_agents, 4, after=record))
        slots.append(slot)
        assert max(held) <= limit
    whole, shared_slot = slots
    assert whole.cache.ram is not None and shared_slot.cache.ram is not None
    assert [r[2] for r in runs[1]] == [r[2] for r in runs[0]]  # the same replies
    w, s = whole.cache.ram.stats(), shared_slot.cache.ram.stats()
    assert s.hits > w.hits and s.evictions <= w.evictions
    assert sum(r[4] for r in runs[1]) < sum(r[4] for r in runs[0])  # fewer prefilled tokens
    assert len(shared_slot.cache.ram.entries) >= len(whole.cache.ram.entries)


async def test_runtime_open_shares_blocks_and_answers_as_with_whole_states(tiny_llama: Path) -> None:
    from runtime import Runtime
    from runtime.errors import InvalidConfig

    async def play(shared: int | None) -> tuple[list[str], int, int]:
        async with Runtime.open(tiny_llama, n_ctx=1024, n_threads=1, cache_ram_mib=64, shared_blocks=shared) as rt:
            texts = []
            for sid in ("a", "b", "c"):
                # a shared prefix, then more of each session's own: the slot swaps conversations (llama-server's
                # rule: the slot would keep under half of its tokens), so RAM holds all three
                await rt.create_session(sid, system="a shared system prompt " * 4 + f"and {sid}'s own part " * 12)
            for turn in range(3):
                for sid in ("a", "b", "c"):
                    r = await rt.chat(sid, f"turn {turn} of {sid}", max_tokens=6, temperature=0.0)
                    texts.append(r.text)
            st = rt.stats().slot
            return texts, st.ram_bytes, st.ram_held_bytes

    whole, shared = await play(None), await play(8)
    assert shared[0] == whole[0]  # the same replies
    assert whole[2] == whole[1] > 0
    assert 0 < shared[2] < shared[1]  # RAM holds the shared prefix once
    with pytest.raises(InvalidConfig):
        async with Runtime.open(tiny_llama, shared_blocks=0):
            pass
