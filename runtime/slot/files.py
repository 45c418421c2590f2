"""llama-server's slot files (`POST /slots/0?action=save|restore|erase`) on turnstile's slot.

A slot file is one record of the disk tier's format (`caches.disk.format`, kind state): the model's
fingerprint and context settings, the slot's tokens, and its state as the disk tier stores it
(`SlotState.parts()`: the sequence state and the slot's checkpoints). The checkpoints are what make a restored
slot reuse its prefix on hybrid and sliding-window models, whose memory cannot drop a suffix (llama-server's
file holds the sequence state alone, so there a restored slot of such a model is reused only whole).

`restore` first keeps what the slot holds in the tiered cache (RAM, or disk), as a swap would: the
conversation that was there loses nothing. `erase` forgets the slot's own state (the cache keeps its entries).
A file of another model or other context settings, a damaged one or a truncated one is refused
(`StateFormatError`) and the slot is left as it was. Nothing is unpickled.
"""

from __future__ import annotations

import os
from pathlib import Path

from caches.disk.format import KIND_STATE, decode, encode_parts
from caches.tiered import Fetched
from runtime.backend.protocol import SlotFile
from runtime.errors import ContextOverflow, StateFormatError
from runtime.log import get_logger
from runtime.slot.executor import Slot
from runtime.slot.state import SlotState

__all__ = ["erase", "restore", "save"]

log = get_logger(__name__)


def _whole(slot: Slot) -> SlotState:
    """The slot's state as one copy (a state kept as shared blocks is assembled by llama.cpp's own read)."""
    return SlotState(slot.engine.state_get(), tuple(slot.checkpoints))


def save(slot: Slot, path: Path) -> SlotFile:
    """Write what the slot holds to `path` (atomically: a temporary file renamed); an empty slot writes a
    file of no tokens, as llama-server's. A reply's last token is evaluated first (`runtime.slot.commit`: the
    slot does so anyway when idle), so the file holds one token more than llama-server's, whose slot never
    evaluates it: `n_saved` is llama-server's + 1 after a reply."""
    slot.settle()
    eng = slot.engine
    state = _whole(slot) if slot.tokens else SlotState(b"", ())
    parts = encode_parts(KIND_STATE, eng.fingerprint, eng.settings_key, slot.tokens, state.parts())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    n = 0
    try:
        with tmp.open("wb") as f:
            for p in parts:
                n += f.write(p)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("slot.saved", n_tokens=len(slot.tokens), nbytes=n, checkpoints=len(state.checkpoints))
    return SlotFile(len(slot.tokens), n)


def restore(slot: Slot, path: Path) -> SlotFile:
    """Load `path` into the slot after keeping the slot's own state in the cache; `StateFormatError` (the
    slot unchanged) for a file this model and these settings cannot use, `FileNotFoundError` if none."""
    eng = slot.engine
    size = path.stat().st_size
    with path.open("rb") as f:
        rec = decode(f, size, kind=KIND_STATE, fingerprint=eng.fingerprint, settings=eng.settings_key)
    tokens = list(rec.tokens)
    if len(tokens) >= eng.n_ctx:
        raise ContextOverflow(len(tokens), eng.n_ctx)
    state = SlotState.decode(rec.payload) if tokens else None
    slot.settle()
    if slot.tokens:
        slot.cache.keep(slot.tokens, slot._state_nbytes(), slot._snapshot())
    if state is None:
        slot.reset()
    elif not slot._load(
        Fetched(0, None, tuple(tokens), state, size)
    ):  # llama.cpp refused it: the slot is empty, as llama-server leaves it
        raise StateFormatError("refused", "llama.cpp did not accept the slot file's state")
    log.info("slot.restored", n_tokens=len(tokens), nbytes=size, checkpoints=len(slot.checkpoints))
    return SlotFile(len(tokens), size)


def erase(slot: Slot) -> int:
    """Forget what the slot holds (the cache's entries stay); the number of tokens it held (a reply's last
    token included, as `save`)."""
    slot.settle()
    n = len(slot.tokens)
    slot.reset()
    log.info("slot.erased", n_tokens=n)
    return n
