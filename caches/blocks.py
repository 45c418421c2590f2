"""States kept as shared blocks of KV cells: each block of a common prefix stored once, with a reference count.

A state of n cells (`caches.kvstate`) is cut into blocks of `block_cells` cells (positions [i*B, (i+1)*B)),
a partial last block of the n % B cells left, and its frame (headers and whatever is kept whole: the SWA
section of sliding-window models, the recurrent section of hybrid ones). A block is addressed by a chained
hash: block i's key is blake2b(key of block i-1 + its B tokens), block 0's predecessor the store's seed
(its namespace: model fingerprint and context settings; the state's cell-layout signature; B). Two states
whose first k blocks of tokens agree share those k blocks; the key of a block says everything before it.

    store = BlockStore(256, namespace=fingerprint + settings_key)
    ref = store.put(tokens, state, Memory.KV)      # copies only the blocks it does not hold yet
    buf = store.get(ref)                           # the state again, assembled in one pass
    store.release(ref)                             # a block goes when no held state uses it
    del ref                                        # ... as it does when the last reference to a state goes

Invariants:
- `get(put(t, s))` is `s` byte for byte, as long as the blocks it shares were stored from states whose
  cells held the same bytes (the slot's own prefix reuse keeps them so; `verify=True` counts the blocks
  that did not, which are then served from the first state that stored them: same tokens, same positions).
- A state whose layout `kvstate` does not know, or that has nothing to cut, is kept whole (logged once per
  reason), never refused and never cut wrong.
- Byte accounting: `logical_bytes` is what whole copies of the held states take, `stored_bytes` what the
  store holds (each block once, plus each state's frame and partial block). Releasing every state brings
  both to zero.
- Reference counts are Python's: a state lists its blocks, the store indexes both weakly. A state is held
  until `release` or until its `StoredState` is dropped, so a RAM cache that loses an entry by any path
  frees what only it used; the byte counts follow at once (CPython frees at the last reference).
- Thread-safe; assembly runs outside the lock on immutable block payloads.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from caches import kvstate
from caches.kvstate import Frame, Memory
from caches.tokens import f32, fdiv, tokens_to_bytes
from runtime.errors import InvalidConfig, StateLayoutError, StateMismatch, StateNotHeld
from runtime.log import get_logger

__all__ = [
    "DEFAULT_BLOCK_CELLS",
    "BlockStore",
    "BlockStoreStats",
    "StoredState",
    "chain_keys",
    "chain_seed",
    "held_bytes",
    "held_victims",
    "plan_held_evictions",
]

log = get_logger(__name__)

SPARE_BYTES = 64 << 20

DEFAULT_BLOCK_CELLS = 64
"""Chosen by `python -m benchmarks shared-prefix` on SmolLM2 (16 agents x 6 turns on a 1,500-token prefix, 4
forks): stored / unique KV 1.029 at 16 cells, 1.067 at 32 and 64, 1.221 at 128, 1.464 at 256; a 6,000-token
state assembles at 2.84, 3.39, 4.18, 4.36, 4.38 GB/s. 64 is the largest within 1.15x."""

_DIGEST = 16


def chain_seed(block_cells: int, namespace: bytes, signature: bytes) -> bytes:
    """The key before block 0 of states of one cell layout (`kvstate.Frame.signature`), of blocks of
    `block_cells` cells, in `namespace` (model fingerprint and context settings). The RAM store and the
    disk tier use the same chain, so a block has one key wherever it is held."""
    head = b"turnstile-blocks-1\0%d\0" % block_cells
    return hashlib.blake2b(head + namespace + b"\0" + signature, digest_size=_DIGEST).digest()


def chain_keys(seed: bytes, tokens: Sequence[int], block_cells: int) -> list[bytes]:
    """The keys of the full blocks of `tokens`: key i = blake2b(key i-1 + tokens of block i), key -1 = seed."""
    keys: list[bytes] = []
    prev = seed
    for start in range(0, len(tokens) - block_cells + 1, block_cells):
        prev = hashlib.blake2b(
            prev + tokens_to_bytes(tokens[start : start + block_cells]), digest_size=_DIGEST
        ).digest()
        keys.append(prev)
    return keys


class _Block:
    """One block's payload. Its reference count is Python's: the held states that list it."""

    __slots__ = ("__weakref__", "data")

    def __init__(self, data: bytearray) -> None:
        self.data = data


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class StoredState:
    """A state as the store holds it: the keys of its full blocks, its partial block and its frame.

    `whole` is why it was not cut ("" when it was); then `frame` holds all of it. The state keeps its
    blocks alive: dropping the last reference to it (a cache entry that goes) releases it, as `release`
    does at once.
    """

    id: int
    frame: Frame
    keys: tuple[bytes, ...]
    tail: bytearray  # never modified
    whole: str
    blocks: list[_Block] = field(repr=False)  # emptied by `release`

    @property
    def size(self) -> int:
        """Bytes of the whole state (what `get` returns)."""
        return self.frame.size

    @property
    def own_bytes(self) -> int:
        """Bytes this state holds alone (frame and partial block)."""
        return self.frame.nbytes + len(self.tail)


@dataclass(frozen=True, slots=True)
class BlockStoreStats:
    """What the store holds and how much sharing saved."""

    states: int
    blocks: int
    logical_bytes: int  # whole copies of every held state
    stored_bytes: int  # each block once + each state's frame and partial block
    block_bytes: int  # the blocks alone
    blocks_shared: int  # blocks a put found already held (not copied)
    blocks_stored: int  # blocks a put copied in
    whole_states: int  # puts kept whole (layout unknown, nothing to cut)
    diverged: int  # with verify: held blocks whose bytes differed from the new state's
    spare_bytes: int  # memory of freed blocks kept for the next ones (not in stored_bytes)


class BlockStore:
    """Blocks of `block_cells` cells, kept once across the states that share them (see the module doc).

    The store indexes blocks and states weakly: a block lives while a held state lists it, a state while
    its caller keeps its `StoredState` and has not released it. So a cache that drops an entry by any path
    (evicted, replaced, loaded) frees what only that entry used, without telling the store.
    """

    def __init__(
        self,
        block_cells: int = DEFAULT_BLOCK_CELLS,
        *,
        namespace: bytes = b"",
        verify: bool = False,
        spare_bytes: int = SPARE_BYTES,
    ) -> None:
        """`spare_bytes`: the memory of freed blocks kept for the next ones (filling fresh memory costs
        more than the copy itself on a VM: `caches.buffers`)."""
        if not isinstance(block_cells, int) or isinstance(block_cells, bool) or block_cells < 1:
            raise InvalidConfig(f"block_cells must be a positive int, not {block_cells!r}")
        self.block_cells = block_cells
        self.namespace = bytes(namespace)
        self.verify = verify
        self._lock = threading.RLock()  # finalizers run on the thread that drops the last reference
        self._blocks: weakref.WeakValueDictionary[bytes, _Block] = weakref.WeakValueDictionary()
        self._states: weakref.WeakValueDictionary[int, StoredState] = weakref.WeakValueDictionary()
        self._finalizers: dict[int, weakref.finalize[..., Any]] = {}
        self._ids = itertools.count(1)
        self._block_bytes = 0
        self._own_bytes = 0
        self._logical = 0
        self._shared = self._copied = self._whole = self._diverged = 0
        self._reasons_logged: set[str] = set()
        self.spare_bytes = spare_bytes
        self._spare: dict[int, list[bytearray]] = {}
        self._spare_total = 0

    def seed(self, signature: bytes) -> bytes:
        """The chain's start for states of one cell layout."""
        return chain_seed(self.block_cells, self.namespace, signature)

    def put(
        self, tokens: Sequence[int], state: kvstate.Buffer, memory: Memory, *, partial: bool = False
    ) -> StoredState:
        """Hold `state` (of `tokens`, as `llama_state_seq_get_data` wrote it for `memory`); copies only the
        blocks not held yet. Raises StateMismatch (nothing changed) if a cut state's cell count is not
        `len(tokens)`."""
        src = memoryview(state).cast("B")
        try:
            layout = kvstate.parse(src, memory, partial=partial)
            whole = layout.reason
        except StateLayoutError as e:
            layout, whole = kvstate.StateLayout(len(src), 0, ()), str(e)
        if not whole and layout.n_cells != len(tokens):
            raise StateMismatch(f"a state of {layout.n_cells} cells given with {len(tokens)} tokens")
        fr = kvstate.frame(src, layout)
        keys = chain_keys(self.seed(fr.signature), tokens, self.block_cells) if not whole else []
        b = self.block_cells
        tail = kvstate.payload(src, layout, len(keys) * b, layout.n_cells)
        with self._lock:  # strong references: a held block stays held until this state lists it
            found = {k: blk for k in keys if (blk := self._blocks.get(k)) is not None}
        size = b * layout.cell_bytes
        fresh = {
            k: kvstate.payload(src, layout, i * b, (i + 1) * b, self._take_spare(size))
            for i, k in enumerate(keys)
            if k not in found
        }
        diverged = 0
        if self.verify:
            diverged = sum(
                found[k].data != kvstate.payload(src, layout, i * b, (i + 1) * b)
                for i, k in enumerate(keys)
                if k in found
            )
        blocks: list[_Block] = []
        with self._lock:
            for k in keys:
                blk = found.get(k) or self._blocks.get(k)  # (another put may have stored it meanwhile)
                if blk is not None:
                    self._shared += 1
                    if k in fresh:
                        self._give_spare(fresh[k])
                else:
                    blk = _Block(fresh[k])
                    self._blocks[k] = blk
                    self._block_bytes += len(blk.data)
                    weakref.finalize(blk, self._block_gone, blk.data)
                    self._copied += 1
                blocks.append(blk)
            ref = StoredState(next(self._ids), fr, tuple(keys), tail, whole, blocks)
            self._states[ref.id] = ref
            self._own_bytes += ref.own_bytes
            self._logical += ref.size
            self._finalizers[ref.id] = weakref.finalize(ref, self._state_gone, ref.id, ref.own_bytes, ref.size)
            self._diverged += diverged
            if whole:
                self._whole += 1
                first = whole not in self._reasons_logged
                self._reasons_logged.add(whole)
        if whole:
            (log.info if first else log.debug)("blocks.whole", reason=whole, nbytes=ref.size)
        return ref

    def _block_gone(self, data: bytearray) -> None:
        with self._lock:
            self._block_bytes -= len(data)
            self._give_spare(data)

    def _give_spare(self, data: bytearray) -> None:
        with self._lock:
            if self._spare_total + len(data) <= self.spare_bytes:
                self._spare.setdefault(len(data), []).append(data)
                self._spare_total += len(data)

    def _take_spare(self, size: int) -> bytearray | None:
        with self._lock:
            free = self._spare.get(size)
            if not free:
                return None
            self._spare_total -= size
            return free.pop()

    def _state_gone(self, state_id: int, own: int, size: int) -> None:
        with self._lock:
            self._finalizers.pop(state_id, None)
            self._own_bytes -= own
            self._logical -= size

    def _check_held(self, ref: StoredState) -> None:
        if self._states.get(ref.id) is not ref:
            raise StateNotHeld(f"state {ref.id} is not held (released, or of another store)")

    def get(self, ref: StoredState, out: memoryview | None = None) -> memoryview:
        """The state of `ref`, assembled into `out` (or a buffer from `STATE_BUFFERS`) in one pass."""
        with self._lock:
            self._check_held(ref)
            blocks = list(ref.blocks)  # alive (their memory not handed on as spare) until assembled
        out = kvstate.assemble(ref.frame, [*(blk.data for blk in blocks), ref.tail], out)
        del blocks
        return out

    def release(self, ref: StoredState) -> None:
        """Stop holding `ref` now; its blocks that no other held state uses are freed."""
        with self._lock:
            self._check_held(ref)
            del self._states[ref.id]
            self._finalizers[ref.id]()  # the accounting, once (a finalizer runs at most once)
            ref.blocks.clear()

    def held_cells(self, tokens: Sequence[int], signature: bytes) -> int:
        """How many leading cells of `tokens` the held blocks of that cell layout cover (whole blocks)."""
        keys = chain_keys(self.seed(signature), tokens, self.block_cells)
        with self._lock:
            n = next((i for i, k in enumerate(keys) if self._blocks.get(k) is None), len(keys))
        return n * self.block_cells

    def stats(self) -> BlockStoreStats:
        with self._lock:
            return BlockStoreStats(
                states=len(self._states),
                blocks=len(self._blocks),
                logical_bytes=self._logical,
                stored_bytes=self._block_bytes + self._own_bytes,
                block_bytes=self._block_bytes,
                blocks_shared=self._shared,
                blocks_stored=self._copied,
                whole_states=self._whole,
                diverged=self._diverged,
                spare_bytes=self._spare_total,
            )


def held_bytes(states: Iterable[StoredState]) -> int:
    """Bytes `states` hold together: each of their blocks once, plus each state's frame and partial block."""
    seen: set[int] = set()
    total = 0
    for st in states:
        total += st.own_bytes
        for blk in st.blocks:
            if id(blk) not in seen:
                seen.add(id(blk))
                total += len(blk.data)
    return total


def plan_held_evictions(
    n_tokens: Sequence[int], held: Callable[[int], int], limit_bytes: int, limit_tokens: int, *, keep: int = 0
) -> int:
    """How many of the oldest entries to evict when entries share memory: llama-server's `update` rule
    (`caches.prompt_cache.plan_update`) on the bytes the remaining entries hold together (`held(k)`: what
    the entries from the k-th on hold) instead of the sum of their whole sizes; never the newest `keep`.

    First the oldest while over the byte limit; then, with a token limit, the oldest while over it, the
    limit raised to what the byte limit holds at the remaining entries' bytes per token, as llama-server
    raises it (with shared blocks a token costs less, so more of them fit). With nothing shared (`held(k)`
    the sum of the sizes from k on) and keep 0, this is `plan_update` exactly.
    """
    n, k = len(n_tokens), 0
    if limit_bytes > 0:
        while k < n - keep and held(k) > limit_bytes:
            k += 1
    if limit_tokens > 0:
        n_tok = sum(n_tokens[k:])
        limit_cur = limit_tokens
        if limit_bytes > 0:  # in C++ float, as plan_update
            per_token = max(1.0, fdiv(held(k), max(1, n_tok)))
            limit_cur = max(limit_tokens, int(f32(f32(limit_bytes) / per_token)))
        while k < n - keep and n_tok > limit_cur:
            n_tok -= n_tokens[k]
            k += 1
    return k


def held_victims(
    order: Sequence[int],
    n_tokens: Sequence[int],
    held: Callable[[Sequence[int]], int],
    limit_bytes: int,
    limit_tokens: int,
) -> list[int]:
    """`plan_held_evictions` with the victims taken in `order` (entry indices, first evicted first; the
    entries not listed are never evicted) instead of oldest first; `held(kept)`: what the entries with the
    indices `kept` hold together. Returns the indices to evict, in `order`. With `order` the oldest first
    (and no `keep`), this evicts exactly the entries `plan_held_evictions` does."""
    alive = set(range(len(n_tokens)))
    out: list[int] = []
    queue = list(order)

    def remaining() -> list[int]:
        return sorted(alive)

    if limit_bytes > 0:
        while queue and held(remaining()) > limit_bytes:
            i = queue.pop(0)
            alive.discard(i)
            out.append(i)
    if limit_tokens > 0:
        n_tok = sum(n_tokens[i] for i in alive)
        limit_cur = limit_tokens
        if limit_bytes > 0:  # in C++ float, as plan_update
            per_token = max(1.0, fdiv(held(remaining()), max(1, n_tok)))
            limit_cur = max(limit_tokens, int(f32(f32(limit_bytes) / per_token)))
        while queue and n_tok > limit_cur:
            i = queue.pop(0)
            alive.discard(i)
            n_tok -= n_tokens[i]
            out.append(i)
    return out
