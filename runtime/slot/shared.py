"""The slot's states in the RAM prompt cache as shared blocks (`Slot(shared_blocks=B)`; off by default).

A `SharedSlotState` is a `SlotState` whose sequence state lives in a `caches.blocks.BlockStore`: the blocks
of a prefix that many conversations share (a long system prompt, a forked history) are held once. The
checkpoints (PARTIAL_ONLY states) stay whole. What the cache rules see does not change: a shared state
weighs what its whole copy weighs (`nbytes`), so `cache_rules="llama-server"` takes llama-server's decisions
exactly, and `"turnstile"` its own, on the same sizes as before; only the memory they hold is less.

The disk tier is not concerned: a state that spills is assembled and written whole (`StateCodec.encode`),
and a state read from disk comes back whole (`SlotState`) until the slot saves it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from caches.blocks import BlockStore, StoredState
from caches.kvstate import Memory
from runtime.errors import StateMismatch
from runtime.log import get_logger
from runtime.slot.state import Bytes, Checkpoint, SlotState

__all__ = ["AnyState", "SharedSlotState", "StateCodec", "share", "state_bytes"]

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
