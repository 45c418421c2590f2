"""Checkpoints for models whose memory cannot drop a suffix: recurrent, hybrid and sliding-window models.

A checkpoint is the sequence's partial state (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`: the recurrent
state, or the sliding-window KV cells) taken after `pos` tokens, with the native memory range
[`pos_min`, `pos_max`] it covers and a hash of the token prefix it belongs to. Restoring it loads that
partial state and removes the attention memory after `pos_max`; the attention prefix itself is never
copied, it must still be in the live context. So a checkpoint stays valid only while the sequence's
memory up to its `pos_max` is unchanged, and whoever changes that memory tells the caches:

- `invalidate_from(pos, seq_id)` after removing (`llama_memory_seq_rm`) or shifting memory from `pos`;
- `invalidate_seq(seq_id)` after clearing the sequence (-1: the whole memory) or loading a state into
  it, or copying another sequence into it;
- `invalidate_except(seq_id)` after `llama_memory_seq_keep(seq_id)`.

Each reaches every cache registered on the same context: caches register themselves per context (weak
references, so registration keeps neither a cache nor the context alive), and `close_context_caches(ctx)`
closes them before the context is freed. Restores, failed restores and device captures notify the
other caches on their own. Raw C API calls nobody reports, and automatic SWA eviction, are not tracked.

Host mode (`on_device=False`) keeps each checkpoint's payload as Python bytes; many checkpoints per
sequence may coexist. Device mode (`on_device=True`) forwards `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`:
llama.cpp keeps the tensors in context-owned buffers keyed by sequence, Python keeps only the
host-visible part, and a new capture overwrites the previous one, so only one checkpoint per sequence
exists (older ones are invalidated, in every device-mode cache on the context).

`restore_checkpoint` accepts only a checkpoint object still held by the cache (the stale-checkpoint
guard): after eviction, `clear`, invalidation or `close`, a kept reference is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import threading
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import llama_cpp

from caches.llama_cache.base import BaseLlamaCache
from runtime.log import get_logger

__all__ = ["HybridCheckpoint", "HybridCheckpointCache", "close_context_caches", "registered_caches"]

log = get_logger(__name__)

_DICT_ERROR = "HybridCheckpointCache: pls use save_checkpoint or restore_checkpoint method"


@dataclass
class HybridCheckpoint:
    """One saved partial state of a sequence, as `HybridCheckpointCache.save_checkpoint` made it."""

    pos: int
    """Token position (number of tokens) where the checkpoint was taken."""
    data: bytes
    """The serialized payload visible to Python (device mode: only the host-visible part)."""
    hash_val: str
    """Hash of the token prefix `tokens[:pos]` (see `HybridCheckpointCache._hash_prefix`)."""
    size: int
    """Bytes written by `llama_state_seq_get_data_ext`."""
    seq_id: int
    pos_min: int = -1
    """Minimum native memory position of the sequence when it was taken."""
    pos_max: int | None = None
    """Maximum native memory position of the sequence when it was taken (None: a manual legacy checkpoint)."""


# --- the per-context registry ------------------------------------------------------------------------

_registry: dict[int, weakref.WeakSet[HybridCheckpointCache]] = {}
_registry_lock = threading.Lock()


def _ctx_key(ctx: object) -> int:
    value = ctx.value if isinstance(ctx, ctypes.c_void_p) else ctx
    if not isinstance(value, int) or value == 0:
        raise ValueError(f"not a llama_context pointer: {ctx!r}")
    return value


def registered_caches(ctx: int) -> list[HybridCheckpointCache]:
    """The open caches registered on context `ctx`."""
    key = _ctx_key(ctx)
    with _registry_lock:
        caches = _registry.get(key)
        found = [c for c in list(caches) if not c._closed] if caches is not None else []
        if caches is not None and not found:
            del _registry[key]
        return found


def close_context_caches(ctx: int) -> int:
    """Close every cache registered on `ctx` (call it before freeing the context); returns how many."""
    caches = registered_caches(ctx)
    for cache in caches:
        cache.close()
    return len(caches)


def _register(cache: HybridCheckpointCache, key: int) -> None:
    with _registry_lock:
        _registry.setdefault(key, weakref.WeakSet()).add(cache)


def _unregister(cache: HybridCheckpointCache, key: int) -> None:
    with _registry_lock:
        caches = _registry.get(key)
        if caches is not None:
            caches.discard(cache)
            if not caches:
                del _registry[key]


# --- the cache ---------------------------------------------------------------------------------------


class HybridCheckpointCache(BaseLlamaCache):
    """Partial-state checkpoints of a borrowed llama.cpp context, found by hash-verified token prefix.

    `ctx` is a raw `llama_context` pointer (`llama_cpp.llama_init_from_model(...)`, `Llama(...)._ctx.ctx`);
    the cache never frees it. `max_checkpoints <= 0` disables checkpointing (nothing is extracted).
    Eviction is FIFO by count. Not a dictionary: `[]`, `in` and item assignment raise NotImplementedError.
    """

    def __init__(
        self, ctx: int | None, max_checkpoints: int = 16, on_device: bool = False, verbose: bool = False
    ) -> None:
        self._closed = True  # until fully set up (close() and __del__ rely on it)
        if ctx is None:
            raise ValueError("HybridCheckpointCache: ctx must be a llama_context pointer, not None")
        key = _ctx_key(ctx)
        super().__init__()
        self._ctx: llama_cpp.llama_context_p | None = llama_cpp.llama_context_p(key)
        self._ctx_id = key
        self._mem: Any = llama_cpp.llama_get_memory(self._ctx)
        model = llama_cpp.llama_get_model(self._ctx)
        # A sliding-window partial state changes size as the window fills: no size check there.
        self._size_varies = bool(model) and int(llama_cpp.llama_model_n_swa(model)) > 0
        self.on_device = on_device
        self.verbose = verbose
        self.max_checkpoints = max_checkpoints
        self.checkpoints: list[HybridCheckpoint] = []
        self._current_size = 0
        self._get_size_ext: Callable[..., int] | None = llama_cpp.llama_state_seq_get_size_ext
        self._get_data_ext: Callable[..., int] | None = llama_cpp.llama_state_seq_get_data_ext
        self._set_data_ext: Callable[..., int] | None = llama_cpp.llama_state_seq_set_data_ext
        self._flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY | (
            llama_cpp.LLAMA_STATE_SEQ_FLAGS_ON_DEVICE if on_device else 0
        )
        self._closed = False
        _register(self, key)
        if max_checkpoints <= 0:
            self._event("checkpoint.disabled", reason="max_checkpoints <= 0: rollback is off")

    def _event(self, event: str, **kw: Any) -> None:
        (log.info if self.verbose else log.debug)(event, on_device=self.on_device, **kw)

    @property
    def cache_size(self) -> int:
        """Host-visible checkpoint bytes held by Python (device mode: not the context-owned tensors)."""
        return self._current_size

    # --- lifetime ----------------------------------------------------------------------------------

    def clear(self) -> None:
        """Drop every checkpoint of this cache (context-owned device buffers stay with llama.cpp)."""
        if not self.checkpoints:
            return
        n = len(self.checkpoints)
        self.checkpoints.clear()
        self._current_size = 0
        self._event("checkpoint.clear", dropped=n)

    def close(self) -> None:
        """Clear, unregister and detach from the context (which is borrowed: not freed). Idempotent."""
        self._close(unregister=True)

    def _close(self, *, unregister: bool) -> None:
        if getattr(self, "_closed", True):
            return
        self.clear()
        self._closed = True
        if unregister:
            _unregister(self, self._ctx_id)
        self._ctx = None
        self._mem = None
        self._get_size_ext = self._get_data_ext = self._set_data_ext = None

    def __del__(self) -> None:
        # No registry lock here: a finalizer may run (by GC) inside a registry operation of this thread;
        # the registry's weak reference goes by itself.
        with contextlib.suppress(Exception):  # a finalizer (maybe at interpreter exit) must not raise
            self._close(unregister=False)

    # --- hashing and lookup ------------------------------------------------------------------------

    def _hash_prefix(self, tokens: Sequence[int], length: int) -> str:
        """SHA-256 (first 32 hex digits) of `tokens[:length]` as int32s; "empty" for length <= 0."""
        if length <= 0:
            return "empty"
        length = min(length, len(tokens))
        return hashlib.sha256(array("i", tokens[:length]).tobytes()).hexdigest()[:32]

    def find_best_checkpoint(self, tokens: Sequence[int], seq_id: int = 0) -> HybridCheckpoint | None:
        """The checkpoint of `seq_id` with the largest `pos` whose token prefix is `tokens[:pos]`.

        The hash check refuses a checkpoint of the same length taken for another prompt or history.
        Among equal positions the newest wins.
        """
        if self.max_checkpoints <= 0 or not self.checkpoints:
            return None
        n = len(tokens)
        hashes: dict[int, str] = {}
        best: HybridCheckpoint | None = None
        for cp in reversed(self.checkpoints):
            if cp.seq_id != seq_id or cp.pos > n or (best is not None and cp.pos <= best.pos):
                continue
            h = hashes.get(cp.pos)
            if h is None:
                h = hashes[cp.pos] = self._hash_prefix(tokens, cp.pos)
            if h == cp.hash_val:
                best = cp
        return best

    # --- save, evict, restore ----------------------------------------------------------------------

    def _evict_checkpoints_if_needed(self) -> None:
        """FIFO: drop the oldest checkpoints until at most `max_checkpoints` remain."""
        while self.checkpoints and len(self.checkpoints) > max(self.max_checkpoints, 0):
            old = self.checkpoints.pop(0)
            self._current_size = max(0, self._current_size - old.size)
            self._event(
                "checkpoint.evict", pos=old.pos, seq_id=old.seq_id, size=old.size, remaining=len(self.checkpoints)
            )

    def save_checkpoint(self, current_pos: int, tokens: Sequence[int], seq_id: int = 0) -> bool:
        """Extract the sequence's partial state as a checkpoint for `tokens[:current_pos]`.

        False when checkpointing is disabled, the cache is closed, the backend reports size 0 or writes
        an unexpected number of bytes. `ValueError` if `current_pos` is outside `0..len(tokens)`.
        """
        if self.max_checkpoints <= 0 or self._closed:
            return False
        if not 0 <= current_pos <= len(tokens):
            raise ValueError(f"current_pos {current_pos} is outside 0..{len(tokens)}")
        assert self._get_size_ext is not None and self._get_data_ext is not None
        if self.on_device:
            # the capture overwrites the sequence's device slot: older device snapshots die with it
            for cache in self._peers():
                if cache.on_device:
                    cache._drop(lambda cp: cp.seq_id == seq_id, "device_capture", seq_id=seq_id)
        size = int(self._get_size_ext(self._ctx, seq_id, self._flags))
        if size == 0:
            self._event("checkpoint.save_failed", reason="state size 0", pos=current_pos, seq_id=seq_id)
            return False
        buf = (ctypes.c_uint8 * size)()
        n = int(self._get_data_ext(self._ctx, buf, size, seq_id, self._flags))
        if n != size:
            self._event(
                "checkpoint.save_failed", reason="short write", written=n, size=size, pos=current_pos, seq_id=seq_id
            )
            return False
        pos_min, pos_max = self._pos_range(seq_id)
        cp = HybridCheckpoint(
            pos=current_pos,
            data=bytes(buf),
            hash_val=self._hash_prefix(tokens, current_pos),
            size=n,
            seq_id=seq_id,
            pos_min=pos_min,
            pos_max=pos_max,
        )
        self.checkpoints.append(cp)
        self._current_size += n
        self._event(
            "checkpoint.save",
            pos=current_pos,
            seq_id=seq_id,
            size=n,
            pos_min=pos_min,
            pos_max=pos_max,
            count=len(self.checkpoints),
        )
        self._evict_checkpoints_if_needed()
        return True

    def _pos_range(self, seq_id: int) -> tuple[int, int]:
        if self._mem is None:
            return -1, -1
        return (
            int(llama_cpp.llama_memory_seq_pos_min(self._mem, seq_id)),
            int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id)),
        )

    def restore_checkpoint(self, cp: HybridCheckpoint, seq_id: int = 0) -> bool:
        """Load `cp` into sequence `seq_id` and remove the memory after its `pos_max`.

        Refused (False, nothing changes) when `cp.seq_id != seq_id`, the cache is closed, `cp` is not
        an object this cache still holds, or (device mode, non-SWA models) the backend's current state
        size differs from `cp.size`. Otherwise True when both the load and the suffix removal succeed;
        then checkpoints beyond the restored range are invalidated in every registered cache on the
        context. On failure (False, or an exception, which propagates) the sequence's checkpoints are
        invalidated, since its memory may already have changed: the caller resets or rebuilds it.
        """
        if cp.seq_id != seq_id:
            self._event("checkpoint.refused", reason="seq_id", cp_seq_id=cp.seq_id, seq_id=seq_id)
            return False
        if self._closed or not any(c is cp for c in self.checkpoints):
            self._event("checkpoint.refused", reason="closed" if self._closed else "stale", pos=cp.pos, seq_id=seq_id)
            return False
        assert self._get_size_ext is not None and self._set_data_ext is not None
        if len(cp.data) != cp.size:
            self._event("checkpoint.refused", reason="payload size", pos=cp.pos, size=cp.size, data=len(cp.data))
            return False
        if self.on_device and not self._size_varies:
            current = int(self._get_size_ext(self._ctx, seq_id, self._flags))
            if current != cp.size:
                self._event("checkpoint.refused", reason="state size", pos=cp.pos, size=cp.size, current=current)
                return False
        suffix = cp.pos_max + 1 if cp.pos_max is not None else cp.pos
        ok = False
        try:
            buf = (ctypes.c_uint8 * cp.size).from_buffer_copy(cp.data)
            n = int(self._set_data_ext(self._ctx, buf, cp.size, seq_id, self._flags))
            ok = n == cp.size
            if not ok:
                self._event("checkpoint.restore_failed", reason="state load", read=n, size=cp.size, pos=cp.pos)
            elif self._mem is not None and not llama_cpp.llama_memory_seq_rm(self._mem, seq_id, suffix, -1):
                ok = False
                self._event("checkpoint.restore_failed", reason="suffix removal", p0=suffix, pos=cp.pos)
        finally:
            if ok:
                self.invalidate_from(suffix, seq_id)
            else:
                self.invalidate_seq(seq_id)
        if ok:
            self._event("checkpoint.restore", pos=cp.pos, seq_id=seq_id, size=cp.size, pos_max=cp.pos_max)
        return ok

    # --- invalidation ------------------------------------------------------------------------------

    def _peers(self) -> list[HybridCheckpointCache]:
        """The caches on this cache's context (itself included, even once unregistered)."""
        caches = registered_caches(self._ctx_id)
        if self not in caches:
            caches.append(self)
        return caches

    def _drop(self, doomed: Callable[[HybridCheckpoint], bool], reason: str, **kw: Any) -> int:
        keep = [cp for cp in self.checkpoints if not doomed(cp)]
        dropped = len(self.checkpoints) - len(keep)
        if dropped:
            freed = sum(cp.size for cp in self.checkpoints if doomed(cp))
            self.checkpoints[:] = keep
            self._current_size = max(0, self._current_size - freed)
            self._event("checkpoint.invalidate", reason=reason, dropped=dropped, remaining=len(keep), **kw)
        return dropped

    def invalidate_from(self, pos: int, seq_id: int = 0) -> int:
        """The memory of `seq_id` (< 0: every sequence) changed from native position `pos` on.

        Call it after `llama_memory_seq_rm(mem, seq_id, pos, p1)` or a shift (`seq_add`/`seq_div`) from
        `pos`. Keeps only the checkpoints whose native range ends strictly before `pos`, in every cache
        registered on this context; returns how many were dropped.
        """

        def doomed(cp: HybridCheckpoint) -> bool:
            return (seq_id < 0 or cp.seq_id == seq_id) and (cp.pos_max is None or cp.pos_max >= pos)

        return sum(c._drop(doomed, "memory_changed", seq_id=seq_id, p0=pos) for c in self._peers())

    def invalidate_seq(self, seq_id: int = -1) -> int:
        """Sequence `seq_id` (< 0: the whole memory) was cleared, loaded or overwritten: drop its checkpoints.

        Reaches every cache registered on this context; returns how many checkpoints were dropped.
        """
        return sum(
            c._drop(lambda cp: seq_id < 0 or cp.seq_id == seq_id, "seq_reset", seq_id=seq_id) for c in self._peers()
        )

    def invalidate_except(self, seq_id: int) -> int:
        """Only `seq_id` was kept (`llama_memory_seq_keep`): drop every other sequence's checkpoints."""
        return sum(c._drop(lambda cp: cp.seq_id != seq_id, "seq_keep", seq_id=seq_id) for c in self._peers())

    # --- the dictionary interface is disabled ------------------------------------------------------

    def __getitem__(self, key: Sequence[int]) -> NoReturn:
        raise NotImplementedError(_DICT_ERROR)

    def __setitem__(self, key: Sequence[int], value: object) -> NoReturn:
        raise NotImplementedError(_DICT_ERROR)

    def __contains__(self, key: Sequence[int]) -> NoReturn:
        raise NotImplementedError(_DICT_ERROR)
