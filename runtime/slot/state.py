"""What the slot saves: its sequence state plus its context checkpoints, and the checkpoint rules.

A `SlotState` is what the prompt cache holds in RAM and what the disk tier stores. Its byte fields are
buffers, never copied once llama.cpp has written them: `Engine.state_get` returns a read-only view of
the buffer llama.cpp filled, `parts()` lays a state out for the disk as a small header followed by
those same buffers (written one after the other, never joined), and `from_buffer` reads a state back as
views into the buffer the disk tier read into (`Engine.state_set` loads straight from them).

Disk layout (little-endian; nothing is pickled):

    0   4   magic b"TSSL"
    4   2   layout version (1)
    6   2   reserved, 0
    8   4   C: checkpoint count
    12  8   state length
    20  40C per checkpoint: n_tokens, pos_min, pos_max, request_id (int64), data length (uint64)
        ..  state bytes, then each checkpoint's data in order

States written before this layout (msgspec msgpack of the same fields) are still read (`decode`).
Checkpoints follow llama-server's rules (`create_checkpoint`, the checkpoint search in `update_slots`):
a list ordered by creation, at most `max_checkpoints`.
"""

from __future__ import annotations

import struct

import msgspec

from runtime.errors import StateFormatError

Bytes = bytes | bytearray | memoryview
"""A byte buffer (contiguous, one byte per item)."""

MAGIC = b"TSSL"
LAYOUT_VERSION = 1
_HEAD = struct.Struct("<4sHxxIQ")
_CKPT = struct.Struct("<qqqqQ")


class Checkpoint(msgspec.Struct, frozen=True):
    """A PARTIAL_ONLY state taken before the batch that starts at `n_tokens` was evaluated."""

    n_tokens: int
    pos_min: int
    pos_max: int
    data: Bytes
    request_id: int = 0

    @property
    def nbytes(self) -> int:
        return len(self.data)


class SlotState(msgspec.Struct, frozen=True):
    """The slot's whole state: the full sequence state and the checkpoints that go with it."""

    state: Bytes
    checkpoints: tuple[Checkpoint, ...] = ()

    @property
    def nbytes(self) -> int:
        return len(self.state) + sum(c.nbytes for c in self.checkpoints)

    def parts(self) -> list[Bytes]:
        """The disk layout as buffers to write one after the other: a header, then the state's own buffers."""
        cps = self.checkpoints
        head = [_HEAD.pack(MAGIC, LAYOUT_VERSION, len(cps), len(self.state))]
        head += [_CKPT.pack(c.n_tokens, c.pos_min, c.pos_max, c.request_id, len(c.data)) for c in cps]
        return [b"".join(head), self.state, *(c.data for c in cps)]

    def encode(self) -> bytes:
        """The disk layout as one `bytes` (a copy; the disk tier writes `parts()` instead)."""
        return b"".join(self.parts())

    @staticmethod
    def from_buffer(data: Bytes) -> SlotState:
        """A state read back from `parts()`'s layout, as views into `data` (no copy); `StateFormatError` if not."""
        view = memoryview(data).cast("B")
        if len(view) < _HEAD.size:
            raise StateFormatError("slot state: truncated header")
        magic, version, n_cps, state_len = _HEAD.unpack_from(view)
        if magic != MAGIC:
            raise StateFormatError("slot state: bad magic")
        if version != LAYOUT_VERSION:
            raise StateFormatError(f"slot state: layout {version}, this build reads {LAYOUT_VERSION}")
        off = _HEAD.size
        if off + n_cps * _CKPT.size > len(view):
            raise StateFormatError("slot state: truncated checkpoint table")
        metas = [_CKPT.unpack_from(view, off + i * _CKPT.size) for i in range(n_cps)]
        off += n_cps * _CKPT.size
        if off + state_len + sum(m[4] for m in metas) != len(view):
            raise StateFormatError("slot state: lengths do not add up to the stored size")
        state = view[off : off + state_len]
        off += state_len
        cps: list[Checkpoint] = []
        for n_tokens, pos_min, pos_max, request_id, size in metas:
            cps.append(Checkpoint(n_tokens, pos_min, pos_max, view[off : off + size], request_id))
            off += size
        return SlotState(state, tuple(cps))

    @staticmethod
    def decode(data: Bytes) -> SlotState:
        """`from_buffer`, or a state stored as msgpack by earlier versions; `StateFormatError` if neither."""
        if bytes(data[:4]) == MAGIC:
            return SlotState.from_buffer(data)
        try:
            old = _LEGACY.decode(data)
        except msgspec.DecodeError as e:
            raise StateFormatError(f"slot state: neither layout {LAYOUT_VERSION} nor msgpack ({e})") from e
        cps = tuple(Checkpoint(c.n_tokens, c.pos_min, c.pos_max, c.data, c.request_id) for c in old.checkpoints)
        return SlotState(old.state, cps)


class _LegacyCheckpoint(msgspec.Struct, frozen=True):
    n_tokens: int
    pos_min: int
    pos_max: int
    data: bytes
    request_id: int = 0


class _LegacySlotState(msgspec.Struct, frozen=True):
    """The msgpack layout states had on disk before `SlotState.parts` (read, never written)."""

    state: bytes
    checkpoints: tuple[_LegacyCheckpoint, ...] = ()


_LEGACY = msgspec.msgpack.Decoder(_LegacySlotState)

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
