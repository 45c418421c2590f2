"""The llama_cache API (`llama_cpp.llama_cache` of a newer llama-cpp-python), on top of 0.3.36.

State caches map token sequences to `llama_cpp.llama.LlamaState`s and work as `Llama.set_cache(...)`
caches: a completion whose prompt shares a prefix with a cached state loads it instead of recomputing.

- `LlamaRAMCache`: in memory, LRU by bytes; lookup picks the cached key with the longest non-empty
  common prefix with the query, even if that key then diverges from it (a linear scan).
- `LlamaTrieCache` (alias `LlamaCache`): in memory, LRU by bytes; lookup picks the longest cached key
  that is wholly a prefix of the query, in O(len(query)) through a token trie.
- `LlamaDiskCache` (`caches.llama_cache.disk`): a diskcache directory, RAM-cache lookup semantics,
  states stored as explicit bytes (no pickles).
- `HybridCheckpoint`, `HybridCheckpointCache` (`caches.llama_cache.hybrid_checkpoint`): partial-state checkpoints
  for recurrent, hybrid and sliding-window models.

All return the stored state as it is (no truncation to the matched prefix). Sizes are
`value.nbytes` when present, else `value.llama_state_size`; a replaced key's old size is subtracted.
An entry larger than `capacity_bytes` is stored and immediately evicted (with everything else).
Nothing prints: every decision is a structlog event (`llama_cache.*`), at debug level, or at info
level for a cache made with `verbose=True`. The caches are not thread-safe: one caller at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from caches.llama_cache.base import DEFAULT_CAPACITY_BYTES, BaseLlamaCache, common_prefix_len, state_nbytes
from caches.llama_cache.disk import LlamaDiskCache
from runtime.log import get_logger

if TYPE_CHECKING:
    from llama_cpp.llama import LlamaState

__all__ = [
    "BaseLlamaCache",
    "LlamaCache",
    "LlamaDiskCache",
    "LlamaRAMCache",
    "LlamaTrieCache",
    "TrieNode",
]

log = get_logger(__name__)

T = TypeVar("T")


def _event(verbose: bool, event: str, **kw: Any) -> None:
    (log.info if verbose else log.debug)(event, **kw)


class _InMemory(BaseLlamaCache):
    """What the two in-memory caches share: their byte count, their verbosity, and the save-then-evict step."""

    def __init__(self, capacity_bytes: int, verbose: bool) -> None:
        super().__init__(capacity_bytes)
        self._current_size = 0
        self.verbose = verbose

    @property
    def cache_size(self) -> int:
        return self._current_size

    def _saved(
        self,
        kind: str,
        key: tuple[int, ...],
        size: int,
        replaced: bool,
        lru: OrderedDict[tuple[int, ...], T],
        drop: Callable[[tuple[int, ...], T], int],
    ) -> None:
        """After a save: log it, then evict the least recently used (`lru`, oldest first; `drop` forgets a key
        and its value taken out of `lru`, and returns the bytes it freed) while over the capacity."""
        _event(
            self.verbose,
            "llama_cache.save",
            cache=kind,
            key_len=len(key),
            nbytes=size,
            replaced=replaced,
            cache_size=self._current_size,
        )
        while self._current_size > self.capacity_bytes and lru:
            evicted, value = lru.popitem(last=False)
            freed = drop(evicted, value)
            _event(
                self.verbose,
                "llama_cache.evict",
                cache=kind,
                key_len=len(evicted),
                nbytes=freed,
                cache_size=self._current_size,
            )
        if not lru:
            self._current_size = 0


class LlamaRAMCache(_InMemory):
    """In-memory LRU cache of `LlamaState`s; lookup by longest non-empty common prefix (linear scan)."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES, verbose: bool = False) -> None:
        super().__init__(capacity_bytes, verbose)
        self.cache_state: OrderedDict[tuple[int, ...], LlamaState] = OrderedDict()
        self._sizes: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.cache_state)

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        best_len, best_key = 0, None
        for k in self.cache_state:
            n = common_prefix_len(k, key)
            if n > best_len:
                best_len, best_key = n, k
                if n == len(key):  # nothing can share more
                    break
        return best_key

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        if not self.cache_state:
            raise KeyError("Cache is empty")
        query = tuple(key)
        found = self._find_longest_prefix_key(query)
        if found is None:
            _event(self.verbose, "llama_cache.miss", cache="ram", query_len=len(query))
            raise KeyError("Key not found")
        self.cache_state.move_to_end(found)
        _event(
            self.verbose,
            "llama_cache.hit",
            cache="ram",
            query_len=len(query),
            key_len=len(found),
            matched=common_prefix_len(found, query),
        )
        return self.cache_state[found]

    def __contains__(self, key: Sequence[int]) -> bool:
        return bool(self.cache_state) and self._find_longest_prefix_key(tuple(key)) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        k = tuple(key)
        size = state_nbytes(value)
        old = self._sizes.pop(k, None)
        if old is not None:
            del self.cache_state[k]
            self._current_size -= old
        self.cache_state[k] = value
        self._sizes[k] = size
        self._current_size += size
        self._saved("ram", k, size, old is not None, self.cache_state, self._drop)

    def _drop(self, key: tuple[int, ...], _state: LlamaState) -> int:
        freed = self._sizes.pop(key)
        self._current_size -= freed
        return freed


class TrieNode:
    """One position in `LlamaTrieCache`'s token trie (internal)."""

    __slots__ = ("children", "state", "state_size")

    def __init__(self) -> None:
        self.children: dict[int, TrieNode] = {}
        self.state: LlamaState | None = None
        self.state_size = 0
        """The bytes `state` was counted for when it was stored."""


class LlamaTrieCache(_InMemory):
    """In-memory LRU cache of `LlamaState`s; lookup by the longest cached key that is a prefix of the query.

    A token trie gives O(K) lookup (K: query length) whatever the number of entries; an `OrderedDict`
    of keys gives O(1) LRU tracking.
    """

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES, verbose: bool = False) -> None:
        super().__init__(capacity_bytes, verbose)
        self.root = TrieNode()
        self.lru_tracker: OrderedDict[tuple[int, ...], TrieNode] = OrderedDict()

    def __len__(self) -> int:
        return len(self.lru_tracker)

    def _find_longest_prefix_node(self, key: tuple[int, ...]) -> tuple[TrieNode | None, tuple[int, ...] | None]:
        node = self.root
        best: TrieNode | None = node if node.state is not None else None
        best_depth = 0
        for depth, tok in enumerate(key, 1):
            child = node.children.get(tok)
            if child is None:
                break
            node = child
            if node.state is not None:
                best, best_depth = node, depth
        if best is None:
            return None, None
        return best, key[:best_depth]

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        return self._find_longest_prefix_node(key)[1]

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        query = tuple(key)
        node, found = self._find_longest_prefix_node(query)
        if node is None or found is None or node.state is None:
            _event(self.verbose, "llama_cache.miss", cache="trie", query_len=len(query))
            raise KeyError("Key not found")
        self.lru_tracker.move_to_end(found)
        _event(self.verbose, "llama_cache.hit", cache="trie", query_len=len(query), key_len=len(found))
        return node.state

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_node(tuple(key))[0] is not None

    def _prune(self, key: tuple[int, ...]) -> None:
        """Remove `key`'s state from the trie, then the nodes left with neither state nor children."""
        node = self.root
        path: list[tuple[TrieNode, int]] = []
        for tok in key:
            child = node.children.get(tok)
            if child is None:
                return
            path.append((node, tok))
            node = child
        if node.state is None:
            return
        self._current_size -= node.state_size
        node.state, node.state_size = None, 0
        self.lru_tracker.pop(key, None)
        for parent, tok in reversed(path):
            child = parent.children[tok]
            if child.children or child.state is not None:
                break
            del parent.children[tok]

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        k = tuple(key)
        size = state_nbytes(value)
        node = self.root
        for tok in k:
            child = node.children.get(tok)
            if child is None:
                child = node.children[tok] = TrieNode()
            node = child
        replaced = node.state is not None
        if replaced:
            self._current_size -= node.state_size
        node.state, node.state_size = value, size
        self._current_size += size
        self.lru_tracker[k] = node
        self.lru_tracker.move_to_end(k)
        self._saved("trie", k, size, replaced, self.lru_tracker, self._drop)

    def _drop(self, key: tuple[int, ...], node: TrieNode) -> int:
        freed = node.state_size
        self._prune(key)
        return freed


LlamaCache = LlamaTrieCache
"""Backward-compatible alias: `LlamaCache` is the trie cache."""
