"""The slot's states in the RAM prompt cache as shared blocks (`Slot(shared_blocks=B)`; off by default).

A `SharedSlotState` is a `SlotState` whose sequence state lives in a `caches.blocks.BlockStore`: the blocks
of a prefix that many conversations share (a long system prompt, a forked history) are held once. The
checkpoints (PARTIAL_ONLY states) stay whole. A shared state's `nbytes` is what its whole copy weighs:
under `cache_rules="llama-server"` the RAM cache's limits count those, so it takes llama-server's decisions
exactly (only the memory it holds is less); under `"turnstile"` they count what the entries hold together
(`held_by_entries`: each shared block once), so more conversations fit in the same limit.

The disk tier is not concerned: a state that spills is assembled and written whole (`StateCodec.encode`),
and a state read from disk comes back whole (`SlotState`) until the slot saves it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from caches.blocks import BlockStore, StoredState, held_bytes
from caches.kvstate import Memory
from caches.prompt_cache import Entry
from runtime.errors import StateMismatch
from runtime.log import get_logger
from runtime.slot.state import Bytes, Checkpoint, SlotState

__all__ = ["AnyState", "SharedSlotState", "StateCodec", "held_by_entries", "share", "state_bytes"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True, eq=False)
class SharedSlotState:
    """A slot state whose sequence state is held by a block store; the checkpoints are whole."""

    ref: StoredState
    checkpoints: tuple[Checkpoint, ...] = ()

    @property
    def nbytes(self) -> int:
        """What the whole copy weighs (the cache rules' size, llama-server's)."""
        return self.ref.size + sum(c.nbytes for c in self.checkpoints)


AnyState = SlotState | SharedSlotState


def share(store: BlockStore, tokens: list[int], state: SlotState, memory: Memory) -> AnyState:
    """`state` held by `store` (its blocks not held yet copied in); `state` itself if its cells are not
    the `tokens` (logged: never a wrong state)."""
    try:
        return SharedSlotState(store.put(tokens, state.state, memory), state.checkpoints)
    except StateMismatch as e:
        log.warning("blocks.mismatch", n_tokens=len(tokens), error=str(e))
        return state


def held_by_entries(entries: Sequence[Entry[AnyState]]) -> int:
    """Bytes RAM entries hold together: their shared blocks once, their frames, partial blocks, checkpoints,
    and the whole size of the ones kept whole."""
    shared = [e.state for e in entries if isinstance(e.state, SharedSlotState)]
    whole = sum(e.nbytes for e in entries if not isinstance(e.state, SharedSlotState))
    cps = sum(c.nbytes for s in shared for c in s.checkpoints)
    return held_bytes(s.ref for s in shared) + whole + cps


def state_bytes(store: BlockStore | None, state: AnyState) -> Bytes:
    """The sequence state to hand to llama.cpp (assembled in one pass when it is shared)."""
    if isinstance(state, SlotState):
        return state.state
    assert store is not None
    return store.get(state.ref)


class StateCodec:
    """Slot states for the tiered cache: `parts()` on disk (a shared one assembled first), their whole size
    in RAM."""

    def __init__(self, store: BlockStore | None) -> None:
        self.store = store

    def encode(self, state: AnyState) -> list[Bytes]:
        if isinstance(state, SharedSlotState):
            state = SlotState(state_bytes(self.store, state), state.checkpoints)
        return state.parts()

    @staticmethod
    def decode(data: Bytes) -> AnyState:
        return SlotState.decode(data)  # views into `data`: the disk tier's read buffer becomes the state

    @staticmethod
    def nbytes(state: AnyState) -> int:
        return state.nbytes
