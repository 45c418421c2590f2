"""A prefill chunk stopped inside llama_decode: the abort check the slot installs during prefill, and what the
slot keeps of a chunk aborted for a pause (docs/fair-slot.md, "Aborting a chunk").

When the abort check says stop during a ubatch, llama.cpp removes that ubatch's KV cells and every later
position (`llama_context::decode`: `memory->seq_rm(seq, pos_min, -1)`) and returns 2; the ubatches before it
stay. Only a transformer's KV cache is ever aborted for a pause: a recurrent or hybrid state is updated in
place and a sliding-window cache prunes cells as it goes, so their aborted chunk cannot be undone exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from runtime.backend.protocol import SlotRequest
from runtime.llama.engine import Engine
from runtime.log import get_logger

log = get_logger(__name__)


def abort_check(eng: Engine, req: SlotRequest, decoding: bool) -> Callable[[], bool]:
    """llama.cpp's abort check during this request's prefill: its cancel check, and for a prefill whose chunks
    may be aborted for a pause (a transformer's KV cache; other memories pause only between chunks), the time its
    scheduler set. Called after every graph node: a read of two attributes and the clock."""
    watch = req.chunks
    if watch is None or decoding or not eng.can_truncate:
        return req.cancel
    cancel, clock = req.cancel, time.perf_counter
    return lambda: cancel() or clock() >= watch.at


def chunk_aborted(eng: Engine, batch: Sequence[int], start: int, seconds: float, rate: float) -> tuple[int, float]:
    """A chunk of `batch` at `start`, aborted for a pause after `seconds`: the tokens of it to keep, and the
    seconds of work thrown away (the time past the kept ubatches, at `rate` seconds a token when known).

    llama.cpp kept its whole ubatches before the aborted one. They stay when n_batch is a multiple of n_ubatch:
    the resumed prefill's ubatches then fall where an unpaused prefill's do (the same shapes). Otherwise the
    chunk goes back to its start. The memory is cut to what is kept."""
    kept = 0
    if eng.n_batch % eng.n_ubatch == 0:
        kept = min(len(batch), max(0, eng.pos_max() + 1 - start))
    eng.seq_rm(start + kept, -1)
    wasted = seconds
    if kept:
        wasted = max(0.0, seconds - kept * rate) if rate else seconds * (len(batch) - kept) / len(batch)
    log.info("prefill.aborted", start=start, kept=kept, aborted=len(batch) - kept, seconds=round(wasted, 4))
    return kept, wasted
