"""The disk tier with shared blocks on real states: every model kind `caches.kvstate` knows, then whole
conversations through the slot and the Runtime.

- Round trip: a state of each kind (f16, q8_0, flash attention on and off, SWA, hybrid; recurrent kept
  whole) stored as blocks, read back by a second tier on the directory, is the state byte for byte, and
  llama.cpp continues from it with the same logits as from the original.
- Agents sharing a system prompt: each agent's state read back from shared blocks (the prefix blocks are
  the first agent's) gives the same logits and the same greedy tokens as its whole copy from a tier without
  blocks (the same conversation, evaluated in the same shapes).
- Through the slot and the Runtime: the same turns as with whole states, and the disk holds less.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from caches import kvstate
from caches.disk.cut import DiskBlocks
from caches.disk.tier import DiskTier
from caches.kvstate import Memory
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.slot.executor import Slot
from runtime.slot.state import Checkpoint, SlotState
from tests.caches.test_kvstate import CASES, INEXACT_RESTORE, NEXT, PROMPT
from tests.slot.test_slot_shared import CFG, _play

B = 16


def _memory(eng: Engine) -> Memory:
    return kvstate.memory_of(str(eng.kind), eng.n_swa)


def _tier(path: Path, eng: Engine, block_cells: int | None = B) -> DiskTier:
    blocks = None if block_cells is None else DiskBlocks(_memory(eng), block_cells)
    return DiskTier(path, fingerprint=eng.fingerprint, settings=eng.settings_key, limit_bytes=0, blocks=blocks)


def _slot_state(eng: Engine, n_tokens: int) -> SlotState:
    cps: tuple[Checkpoint, ...] = ()
    if _memory(eng) is not Memory.KV:  # what the slot keeps beside them: a PARTIAL_ONLY checkpoint
        cps = (Checkpoint(n_tokens, 0, n_tokens - 1, bytes(eng.state_get(partial=True))),)
    return SlotState(bytes(eng.state_get()), cps)


@pytest.mark.parametrize("case", list(CASES))
def test_every_model_kind_round_trips_through_disk_blocks(
    case: str, models: dict[str, Path], make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    model, config, n_cut = CASES[case]
    eng = make_engine(models[model], config)
    eng.decode(PROMPT, 0)
    state = _slot_state(eng, len(PROMPT))
    with _tier(tmp_path, eng) as t:
        assert t.put(PROMPT, state.parts()) is True
        st = t.stats()
        if n_cut:
            assert (st.blocks, st.whole_states) == (n_cut // B, 0)  # 2 full blocks, 13 cells in the record
        else:
            assert (st.blocks, st.whole_states) == (0, 1)  # recurrent: kept whole
    with _tier(tmp_path, eng) as again:  # a second tier: the index and blocks from the directory
        got = again.find([*PROMPT, NEXT])
        assert got is not None and got[0] == PROMPT
        assert bytes(got[1]) == state.encode()
        back = SlotState.decode(got[1])
    assert [bytes(c.data) for c in back.checkpoints] == [bytes(c.data) for c in state.checkpoints]
    eng.decode([NEXT], len(PROMPT))
    live = eng.logits()
    fresh = make_engine(models[model], config)
    assert fresh.state_set(back.state)
    fresh.decode([NEXT], len(PROMPT))
    if case in INEXACT_RESTORE:  # llama.cpp's own restore of these is not exact (tests/caches/test_kvstate.py)
        np.testing.assert_allclose(fresh.logits(), live, atol=1e-4)
    else:
        np.testing.assert_array_equal(fresh.logits(), live)


SYSTEM = [(7 * i + 3) % 300 + 5 for i in range(40)]
CONFIG = EngineConfig(n_ctx=256, n_threads=1)


def _greedy(eng: Engine, first: int, pos: int, n: int) -> tuple[list[int], np.ndarray]:
    """Evaluate `first` at `pos`, then n greedy tokens; (the tokens, the first logits)."""
    eng.decode([first], pos)
    logits = np.array(eng.logits())
    out = []
    tok = int(np.argmax(logits))
    for i in range(n):
        out.append(tok)
        eng.decode([tok], pos + 1 + i)
        tok = int(np.argmax(eng.logits()))
    return out, logits


@pytest.mark.parametrize("model", ["llama", "gemma3", "jamba", "mamba"])
def test_agents_restored_from_shared_disk_blocks_continue_as_from_whole_copies(
    model: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    eng = make_engine(tiny_models[model], CONFIG)
    agents = [SYSTEM + [50 + j, 60 + j, 70 + j] * (j + 1) for j in range(3)]
    blocked, whole = _tier(tmp_path / "blocks", eng), _tier(tmp_path / "whole", eng, None)
    try:
        for toks in agents:  # as the slot does: reuse the system prompt, evaluate the rest
            if eng.can_truncate and eng.pos_max() >= len(SYSTEM):
                assert eng.seq_rm(len(SYSTEM))
                eng.decode(toks[len(SYSTEM) :], len(SYSTEM))
            else:
                eng.clear()
                eng.decode(toks, 0)
            parts = _slot_state(eng, len(toks)).parts()
            assert blocked.put(toks, parts) and whole.put(toks, parts)
        b, w = blocked.stats(), whole.stats()
        if _memory(eng) is Memory.RECURRENT:
            assert (b.whole_states, b.blocks) == (3, 0)
        else:
            assert (b.blocks_shared, b.whole_states) == (2 * 2, 0)  # SYSTEM's 2 full blocks, held once
            assert b.stored_bytes < b.logical_bytes == w.bytes  # logical: what the tier without blocks holds
        for toks in agents:
            runs = []
            for t in (blocked, whole):
                got = t.find(toks)
                assert got is not None and got[0] == toks
                fresh = make_engine(tiny_models[model], CONFIG)
                assert fresh.state_set(SlotState.decode(got[1]).state)
                runs.append(_greedy(fresh, 11, len(toks), 4))
            assert runs[0][0] == runs[1][0]  # the same tokens
            np.testing.assert_array_equal(runs[0][1], runs[1][1])  # the same logits
    finally:
        blocked.close()
        whole.close()


@pytest.mark.parametrize("arch", ["llama", "jamba"])
def test_the_slot_spilling_to_disk_blocks_plays_the_same_turns_and_the_disk_holds_less(
    arch: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    """RAM for about one state, a disk tier behind it: every turn swaps through disk; with blocks the turns
    are those of whole copies, and the directory holds the shared prefix once."""
    runs, disks = [], []
    for shared in (None, 8):
        eng = make_engine(tiny_models[arch], CFG)
        disk = _tier(tmp_path / f"disk-{shared}", eng, shared)
        disks.append(disk)
        slot = Slot(eng, cache_ram_bytes=1, disk=disk, shared_blocks=shared)
        runs.append(_play(eng, slot, 3, 3, system="Be brief."))  # a short prefix: every turn swaps
        assert slot.stats().disk_loads >= 3
        slot.flush()
    assert runs[1] == runs[0]  # tokens, cached and prefilled counts, where each state came from
    a, b = (d.stats() for d in disks)
    assert a.entries == b.entries and a.blocks == 0 < b.blocks
    assert b.logical_bytes == a.bytes  # the same whole states, had they been stored whole
    assert b.blocks_shared > 0  # (jamba keeps its recurrent section and checkpoints whole)
    assert b.stored_bytes < (0.75 if arch == "llama" else 0.95) * b.logical_bytes
    for d in disks:
        d.close()


async def test_a_restarted_runtime_brings_conversations_back_from_disk_blocks(tiny_llama: Path, tmp_path: Path) -> None:
    from runtime import Runtime
    from runtime.api import TierBytes
    from runtime.serve.http import app as make_app
    from tests.api.test_stats import get_metrics

    async def play(shared: int | None) -> tuple[list[str], list[str], int, int]:
        data = tmp_path / f"data-{shared}"
        texts, sources = [], []
        for run in range(2):  # then a restart: every conversation's state comes from the disk tier
            async with Runtime.open(
                tiny_llama, data_dir=data, n_ctx=1024, n_threads=1, cache_ram_mib=64, shared_blocks=shared
            ) as rt:
                for sid in ("a", "b", "c"):
                    if run == 0:
                        await rt.create_session(sid)
                for sid in ("a", "b", "c"):
                    # a shared prefix, then more of each session's own: the slot swaps conversations
                    own = f"and {sid}'s own part " * 12 if run == 0 else f"hello from {sid}"
                    r = await rt.chat(sid, "a shared prompt " * 5 + own, max_tokens=6, temperature=0.0)
                    texts.append(r.text)
                    sources.append(r.cache_source)
                st = rt.stats()
                disk = st.disk
                assert disk is not None
                m = await get_metrics(make_app(rt))
                for tier, b in st.storage.items():  # /metrics says what rt.stats() says
                    assert m[f'turnstile_state_logical_bytes{{tier="{tier}"}}'] == b.logical
                    assert m[f'turnstile_state_stored_bytes{{tier="{tier}"}}'] == b.stored
                assert st.storage["disk"] == TierBytes(logical=disk.logical_bytes, stored=disk.bytes)
                assert st.storage["ram"] == TierBytes(logical=st.slot.ram_bytes, stored=st.slot.ram_held_bytes)
                assert m['turnstile_state_blocks{tier="disk"}'] == disk.blocks
        return texts, sources, disk.logical_bytes, disk.stored_bytes

    whole, shared = await play(None), await play(16)
    assert shared[:2] == whole[:2]  # the same replies, the states from the same places
    assert shared[1][3:] == ["disk", "disk", "disk"]
    assert whole[2] == whole[3] > 0
    assert 0 < shared[3] < shared[2]
