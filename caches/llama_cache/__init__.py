"""The llama_cache API (`llama_cpp.llama_cache` of a newer llama-cpp-python), on top of 0.3.36.

For llama-cpp-python users: `Llama.set_cache(...)` caches (`LlamaRAMCache`, `LlamaTrieCache` alias
`LlamaCache`, `LlamaDiskCache`) and partial-state checkpoints (`HybridCheckpoint`,
`HybridCheckpointCache`). The runtime does not use them; importing this package loads llama.cpp.
"""

from caches.llama_cache.hybrid_checkpoint import HybridCheckpoint, HybridCheckpointCache
from caches.llama_cache.ram_trie import (
    BaseLlamaCache,
    LlamaCache,
    LlamaDiskCache,
    LlamaRAMCache,
    LlamaTrieCache,
    TrieNode,
)

__all__ = [
    "BaseLlamaCache",
    "HybridCheckpoint",
    "HybridCheckpointCache",
    "LlamaCache",
    "LlamaDiskCache",
    "LlamaRAMCache",
    "LlamaTrieCache",
    "TrieNode",
]
