"""What the slot saves: its sequence state plus its context checkpoints, and the checkpoint rules.

A `SlotState` is what the prompt cache holds in RAM and what the disk tier stores as bytes
(msgspec msgpack, never pickle). Checkpoints follow llama-server's rules (`create_checkpoint`,
the checkpoint search in `update_slots`): a list ordered by creation, at most `max_checkpoints`.
"""

from __future__ import annotations

import msgspec


class Checkpoint(msgspec.Struct, frozen=True):
    """A PARTIAL_ONLY state taken before the batch that starts at `n_tokens` was evaluated."""

    n_tokens: int
    pos_min: int
    pos_max: int
    data: bytes
    request_id: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.data)


class SlotState(msgspec.Struct, frozen=True):
    """The slot's whole state: the full sequence state and the checkpoints that go with it."""

    state: bytes
    checkpoints: tuple[Checkpoint, ...] = ()

    @property
    def nbytes(self) -> int:
        return len(self.state) + sum(c.nbytes for c in self.checkpoints)

    def encode(self) -> bytes:
        return _ENCODER.encode(self)

    @staticmethod
    def decode(data: bytes) -> SlotState:
        return _DECODER.decode(data)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(SlotState)

N_CTX_CHECKPOINTS = 32  # llama-server --ctx-checkpoints
CHECKPOINT_MIN_STEP = 8192  # llama-server --checkpoint-min-step


def make_room(
    checkpoints: list[Checkpoint],
    n_tokens_new: int,
    request_id: int,
    *,
    max_checkpoints: int = N_CTX_CHECKPOINTS,
    min_step: int = CHECKPOINT_MIN_STEP,
) -> list[Checkpoint]:
    """The checkpoints kept when one at `n_tokens_new` is about to be added (llama-server's create_checkpoint).

    When the list is full, checkpoints of earlier requests within `min_step` of the one before are
    dropped first; then the oldest until there is room; a checkpoint at the same n_tokens is superseded.
    """
    kept = list(checkpoints)
    last, i = -1, 0
    while len(kept) + 1 >= max_checkpoints and i < len(kept):
        c = kept[i]
        if c.request_id != request_id and last >= 0 and c.n_tokens <= last + min_step:
            del kept[i]
            continue
        last = c.n_tokens
        i += 1
    while kept and len(kept) >= max_checkpoints:
        kept.pop(0)
    return [c for c in kept if c.n_tokens != n_tokens_new]


def find_restore(checkpoints: list[Checkpoint], pos_next: int, pos_min_thold: int) -> Checkpoint | None:
    """The newest checkpoint that can serve a rollback to `pos_next` (llama-server's search)."""
    for c in reversed(checkpoints):
        if c.pos_max > pos_next:
            continue
        if c.pos_min < pos_min_thold or c.pos_min == 0:
            return c
    return None
