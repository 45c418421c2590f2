"""The base of the llama_cache API: `BaseLlamaCache` and the helpers every state cache shares.

`BaseLlamaCache` subclasses llama-cpp-python's own `llama_cpp.llama_cache.BaseLlamaCache`, so every
cache here is accepted (and type-checks) wherever llama-cpp-python takes a cache, e.g.
`llama_cpp.Llama.set_cache`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

import llama_cpp.llama_cache as _upstream

from caches.tokens import lcp
from runtime.log import get_logger

if TYPE_CHECKING:
    from llama_cpp.llama import LlamaState

__all__ = ["DEFAULT_CAPACITY_BYTES", "BaseLlamaCache", "common_prefix_len", "state_nbytes"]

log = get_logger(__name__)

DEFAULT_CAPACITY_BYTES = 2 << 30
"""2 GiB, the default `capacity_bytes` of every cache."""


def state_nbytes(value: object) -> int:
    """The bytes a cached state counts for: `value.nbytes` when present, else `value.llama_state_size`.

    Newer `LlamaState`s define `nbytes` (native state plus owned arrays); 0.3.36's, and other legacy
    objects, only have `llama_state_size`.
    """
    nbytes = getattr(value, "nbytes", None)
    if nbytes is None:
        nbytes = getattr(value, "llama_state_size", None)
    if nbytes is None:
        raise TypeError(f"{type(value).__name__} has neither `nbytes` nor `llama_state_size`")
    size = int(nbytes)
    if size < 0:
        raise ValueError(f"state size must not be negative, got {size}")
    return size


common_prefix_len = lcp
"""Length of the longest common prefix of two token tuples (or two bytes strings): `caches.tokens.lcp`."""


class BaseLlamaCache(_upstream.BaseLlamaCache):
    """Base cache class for llama.cpp states: a mapping from token sequences to `LlamaState`s.

    Lookup is by prefix, not exact key (each subclass says which prefix). Subclasses implement
    `cache_size`, `__getitem__`, `__contains__` and `__setitem__`.
    """

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must not be negative, got {capacity_bytes}")
        super().__init__(capacity_bytes)
        self.capacity_bytes = capacity_bytes

    @property
    @abstractmethod
    def cache_size(self) -> int:
        """Current size of the cache in bytes."""
        raise NotImplementedError

    def __bool__(self) -> bool:
        # llama-cpp-python tests `if self.cache:`; an empty cache must still be used.
        return True

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        """The cached key that best matches `key` (a placeholder here; subclasses override it)."""
        return None

    @abstractmethod
    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        raise NotImplementedError

    @abstractmethod
    def __contains__(self, key: Sequence[int]) -> bool:
        raise NotImplementedError

    @abstractmethod
    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        raise NotImplementedError
