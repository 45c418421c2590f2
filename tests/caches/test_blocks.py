"""caches.blocks: states kept as shared blocks, with reference counts and byte accounting.

Model-free with states written by `tests.support.kvstate_writer` (exact byte counts), then real states of tiny
models: a conversation restored from shared blocks continues exactly as one restored from its whole copy.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from caches import kvstate
from caches.blocks import BlockStore, chain_keys, held_victims, plan_held_evictions
from caches.kvstate import Memory
from caches.prompt_cache import plan_update
from runtime.config import EngineConfig
from runtime.errors import BadInput, InvalidConfig, NotFound, StateMismatch, StateNotHeld
from runtime.llama.engine import Engine
from runtime.log import capture_logs
from tests.support.kvstate_writer import CELL_BYTES, FRAME_BYTES, kv_state

B = 16
PREFIX = [(5 * i + 1) % 200 for i in range(100)]  # 6 full blocks and 4 cells


def _agent(j: int) -> list[int]:
    return PREFIX + [300 + j] * (20 + j)


def test_sixteen_states_sharing_a_prefix_hold_its_blocks_once() -> None:
    store = BlockStore(B)
    refs = [store.put(_agent(j), kv_state(_agent(j)), Memory.KV) for j in range(16)]
    own_full = [(120 + j) // B - 6 for j in range(16)]  # full blocks past the shared 96 cells
    tails = [(120 + j) % B for j in range(16)]
    st = store.stats()
    assert st.states == 16
    assert st.blocks == 6 + sum(own_full)
    assert (st.blocks_shared, st.blocks_stored) == (15 * 6, 6 + sum(own_full))
    assert st.block_bytes == st.blocks * B * CELL_BYTES
    assert st.stored_bytes == st.block_bytes + 16 * FRAME_BYTES + sum(tails) * CELL_BYTES
    assert st.logical_bytes == sum(FRAME_BYTES + (120 + j) * CELL_BYTES for j in range(16))
    assert (st.whole_states, st.diverged) == (0, 0)
    for j, ref in enumerate(refs):
        assert bytes(store.get(ref)) == kv_state(_agent(j))
        assert len(ref.keys) == 6 + own_full[j]
    assert {r.keys[:6] for r in refs} == {refs[0].keys[:6]}


def test_release_frees_only_the_blocks_no_held_state_uses() -> None:
    store = BlockStore(B)
    a = store.put(_agent(0), kv_state(_agent(0)), Memory.KV)
    b = store.put(_agent(1), kv_state(_agent(1)), Memory.KV)
    both = store.stats().blocks
    store.release(a)
    st = store.stats()
    assert st.blocks == both - (len(a.keys) - 6)  # a's own full blocks went, the shared six stayed
    assert bytes(store.get(b)) == kv_state(_agent(1))
    store.release(b)
    st = store.stats()
    assert (st.states, st.blocks, st.stored_bytes, st.logical_bytes, st.block_bytes) == (0, 0, 0, 0, 0)


def test_a_state_not_held_is_refused() -> None:
    store, other = BlockStore(B), BlockStore(B)
    ref = store.put(_agent(0), kv_state(_agent(0)), Memory.KV)
    foreign = other.put(_agent(0), kv_state(_agent(0)), Memory.KV)
    for call in (store.get, store.release):
        with pytest.raises(StateNotHeld) as e:
            call(foreign)
        assert isinstance(e.value, NotFound)
    store.release(ref)
    for call in (store.get, store.release):
        with pytest.raises(StateNotHeld):
            call(ref)


def test_tokens_that_do_not_match_the_cells_are_refused_and_change_nothing() -> None:
    store = BlockStore(B)
    held = store.put(_agent(0), kv_state(_agent(0)), Memory.KV)
    before = store.stats()
    with pytest.raises(StateMismatch) as e:
        store.put(_agent(1)[:-1], kv_state(_agent(1)), Memory.KV)
    assert isinstance(e.value, BadInput)
    assert store.stats() == before
    assert bytes(store.get(held)) == kv_state(_agent(0))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "16"])
def test_a_block_size_that_is_not_a_positive_int_is_refused(bad: object) -> None:
    with pytest.raises(InvalidConfig):
        BlockStore(bad)  # type: ignore[arg-type]


def test_states_it_cannot_cut_are_kept_whole_and_logged_once_per_reason() -> None:
    store = BlockStore(B)
    garbage = bytes(range(256)) * 3
    shuffled = kvstate.MAGIC.to_bytes(4, "little") + b"\0" * 4  # a header, then nothing
    with capture_logs() as logs:
        r1 = store.put([1, 2], garbage, Memory.KV)
        r2 = store.put([1, 2], garbage, Memory.KV)
        r3 = store.put([], shuffled, Memory.KV)
    assert bytes(store.get(r1)) == garbage and bytes(store.get(r2)) == garbage
    assert bytes(store.get(r3)) == shuffled
    assert r1.whole.startswith("layout:") and r1.keys == ()
    events = [e for e in logs if e["event"] == "blocks.whole"]
    assert [e["log_level"] for e in events] == ["info", "debug", "info"]
    st = store.stats()
    assert (st.whole_states, st.blocks) == (3, 0)
    assert st.stored_bytes == st.logical_bytes == 2 * len(garbage) + len(shuffled)


def test_blocks_are_shared_only_within_one_namespace_and_cell_layout() -> None:
    toks = _agent(0)
    store = BlockStore(B)
    plain = store.put(toks, kv_state(toks), Memory.KV)
    trans = store.put(toks, kv_state(toks, v_trans=True), Memory.KV)
    seq1 = store.put(toks, kv_state(toks, seq=1), Memory.KV)
    assert not {*plain.keys} & {*trans.keys} and not {*plain.keys} & {*seq1.keys}
    assert store.stats().blocks_shared == 0
    for ref, want in ((plain, kv_state(toks)), (trans, kv_state(toks, v_trans=True)), (seq1, kv_state(toks, seq=1))):
        assert bytes(store.get(ref)) == want
    other = BlockStore(B, namespace=b"another model")
    assert other.put(toks, kv_state(toks), Memory.KV).keys[0] != plain.keys[0]


def test_verify_counts_blocks_whose_bytes_differ_and_the_first_copy_is_served() -> None:
    toks = _agent(0)
    store = BlockStore(B, verify=True)
    first_ref = store.put(toks, kv_state(toks), Memory.KV)
    ref = store.put(toks, kv_state(toks, salt=b"other batch split"), Memory.KV)
    assert store.stats().diverged == len(ref.keys)
    got = bytes(store.get(ref))
    first = kv_state(toks)
    n_shared = len(ref.keys) * B
    layout = kvstate.parse(got, Memory.KV)
    assert kvstate.payload(got, layout, 0, n_shared) == kvstate.payload(first, layout, 0, n_shared)
    assert first_ref.keys == ref.keys


def test_held_cells_counts_the_whole_blocks_of_a_prompt_the_store_holds() -> None:
    store = BlockStore(B)
    ref = store.put(_agent(0), kv_state(_agent(0)), Memory.KV)
    sig = ref.frame.signature
    assert store.held_cells(PREFIX + [999] * 50, sig) == 96
    assert store.held_cells(_agent(0) + [7] * 40, sig) == len(ref.keys) * B
    assert store.held_cells([999, *PREFIX], sig) == 0
    assert store.held_cells(PREFIX, b"another layout") == 0


def test_chain_keys_depend_on_everything_before_a_block() -> None:
    a = chain_keys(b"seed", list(range(40)), 16)
    assert len(a) == 2
    assert chain_keys(b"seed", list(range(32)), 16) == a
    assert chain_keys(b"seed", [1, *range(1, 40)], 16)[1] != a[1]  # block 1's tokens equal, block 0's not
    assert chain_keys(b"other", list(range(40)), 16)[0] != a[0]


# --- real states ---------------------------------------------------------------------------------------

CONFIG = EngineConfig(n_ctx=256, n_threads=1)
SYSTEM = [(7 * i + 3) % 300 + 5 for i in range(40)]


@pytest.mark.parametrize("model", ["llama", "gemma3", "jamba", "mamba"])
def test_agents_restored_from_shared_blocks_continue_as_from_whole_copies(
    model: str, tiny_models: dict[str, Path], make_engine: Callable[..., Engine]
) -> None:
    eng = make_engine(tiny_models[model], CONFIG)
    memory = kvstate.memory_of(str(eng.kind), eng.n_swa)
    store = BlockStore(B)
    agents = [SYSTEM + [50 + j, 60 + j, 70 + j] * (j + 1) for j in range(3)]
    wholes, refs = [], []
    for toks in agents:  # as the slot does: reuse the system prompt, evaluate the rest
        if eng.can_truncate and eng.pos_max() >= len(SYSTEM):
            assert eng.seq_rm(len(SYSTEM))
            eng.decode(toks[len(SYSTEM) :], len(SYSTEM))
        else:
            eng.clear()
            eng.decode(toks, 0)
        whole = bytes(eng.state_get())
        wholes.append(whole)
        refs.append(store.put(toks, whole, memory))
    st = store.stats()
    if memory is Memory.RECURRENT:
        assert st.whole_states == 3 and st.blocks == 0
    else:
        assert st.whole_states == 0 and st.blocks_shared == 2 * 2  # SYSTEM's 2 full blocks, held once
        assert st.stored_bytes < st.logical_bytes
    for toks, whole, ref in zip(agents, wholes, refs, strict=True):
        assert bytes(store.get(ref)) == whole
        got = []
        for data in (whole, bytes(store.get(ref))):
            fresh = make_engine(tiny_models[model], CONFIG)
            assert fresh.state_set(data)
            fresh.decode([11, 12], len(toks))
            got.append(fresh.logits())
        np.testing.assert_array_equal(got[1], got[0])


def test_a_state_dropped_without_release_frees_what_only_it_used() -> None:
    """A cache that drops an entry by any path (evicted, replaced, loaded) needs no call to the store."""
    store = BlockStore(B)
    keep = store.put(_agent(0), kv_state(_agent(0)), Memory.KV)
    alone = store.stats()
    gone = store.put(_agent(1), kv_state(_agent(1)), Memory.KV)
    assert store.stats().blocks > alone.blocks
    del gone
    st = store.stats()
    assert (st.states, st.blocks, st.stored_bytes, st.logical_bytes) == (
        1,
        alone.blocks,
        alone.stored_bytes,
        alone.logical_bytes,
    )
    assert bytes(store.get(keep)) == kv_state(_agent(0))
    store.release(keep)
    assert store.stats().stored_bytes == 0


def _rest(sizes: list[int], k: int) -> int:
    return sum(sizes[k:])


def test_held_evictions_without_sharing_are_llama_servers_update_exactly() -> None:
    rnd = random.Random(3)
    for _ in range(2000):
        n = rnd.randrange(0, 7)
        sizes = [rnd.randrange(1, 5000) for _ in range(n)]
        counts = [rnd.randrange(1, 400) for _ in range(n)]
        limit_bytes, limit_tokens = rnd.choice([0, rnd.randrange(1, 20000)]), rnd.choice([0, rnd.randrange(1, 2000)])
        want = plan_update(list(zip(sizes, counts, strict=True)), limit_bytes, limit_tokens)
        got = plan_held_evictions(counts, functools.partial(_rest, sizes), limit_bytes, limit_tokens)
        assert got == want, (sizes, counts, limit_bytes, limit_tokens)


def test_held_evictions_count_what_the_rest_holds_and_keep_the_newest() -> None:
    # four entries sharing 900 bytes, 100 of their own each: together they hold 900 + 100 * (4 - k)
    def held(k: int) -> int:
        return 900 + 100 * (4 - k) if k < 4 else 0

    assert plan_held_evictions([10] * 4, held, 1300, 0) == 0  # whole sizes (4000) would evict 3
    assert plan_held_evictions([10] * 4, held, 1150, 0) == 2
    assert plan_held_evictions([10] * 4, held, 500, 0) == 4
    assert plan_held_evictions([10] * 4, held, 500, 0, keep=1) == 3
    assert plan_held_evictions([10] * 4, held, 0, 25) == 2  # tokens alone: as llama-server


def test_held_victims_taken_oldest_first_are_plan_held_evictions_exactly() -> None:
    rnd = random.Random(5)
    for _ in range(2000):
        n = rnd.randrange(0, 7)
        sizes = [rnd.randrange(1, 5000) for _ in range(n)]
        counts = [rnd.randrange(1, 400) for _ in range(n)]
        limit_bytes, limit_tokens = rnd.choice([0, rnd.randrange(1, 20000)]), rnd.choice([0, rnd.randrange(1, 2000)])
        keep = rnd.randrange(0, 2)
        want = plan_held_evictions(counts, functools.partial(_rest, sizes), limit_bytes, limit_tokens, keep=keep)
        got = held_victims(
            list(range(max(0, n - keep))),
            counts,
            lambda kept, sizes=sizes: sum(sizes[i] for i in kept),  # type: ignore[misc]
            limit_bytes,
            limit_tokens,
        )
        assert got == list(range(want)), (sizes, counts, limit_bytes, limit_tokens, keep)


def test_held_victims_follow_the_order_and_spare_the_unlisted() -> None:
    sizes = [100, 200, 300, 400]
    held = lambda kept: sum(sizes[i] for i in kept)  # noqa: E731
    assert held_victims([3, 1, 0], [1] * 4, held, 500, 0) == [3, 1]  # 1000 -> 600 -> 400
    assert held_victims([3, 1, 0], [1] * 4, held, 600, 0) == [3]
    assert held_victims([0], [1] * 4, held, 100, 0) == [0]  # the unlisted stay, over the limit or not
    assert held_victims([2, 0, 1], [10, 10, 10, 10], held, 0, 25) == [2, 0]  # tokens alone


def test_the_memory_of_freed_blocks_serves_the_next_ones_up_to_a_limit() -> None:
    store = BlockStore(B, spare_bytes=3 * B * CELL_BYTES)
    a = store.put(_agent(0), kv_state(_agent(0)), Memory.KV)
    first = {id(blk.data) for blk in a.blocks}
    store.release(a)
    assert store.stats().spare_bytes == 3 * B * CELL_BYTES  # three kept, the others went back
    other = [7000 + i for i in range(60)]
    b = store.put(other, kv_state(other), Memory.KV)
    assert len({id(blk.data) for blk in b.blocks} & first) == 3
    assert store.stats().spare_bytes == 0
    assert bytes(store.get(b)) == kv_state(other)
