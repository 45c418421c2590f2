"""`LlamaDiskCache`: `LlamaState`s in a diskcache directory, as explicit bytes (nothing is pickled).

Keys are the token sequence as little-endian int32 bytes, values the state encoded by `encode_state`;
diskcache stores both raw (bytes keys and small values in SQLite, large values in files). Lookup
semantics are the RAM cache's: the cached key with the longest non-empty common prefix with the query.

Value layout (little-endian):

    offset  size  field
    0       4     magic b"LCST"
    4       2     format version (1)
    6       2     reserved, 0
    8       8     n_tokens (int64)
    16      8     seed (int64)
    24      8     llama_state_size (uint64)
    32      8     I: input_ids length (uint64)
    40      8     R: scores rows (uint64)
    48      8     C: scores columns (uint64)
    56      8     S: llama_state length (uint64)
    64      4I    input_ids, int32
            4RC   scores, float32, row-major
            S     llama_state
            4     CRC-32 (zlib) of everything before it

Reads are non-destructive. An entry that cannot be decoded (damaged, truncated, another format) is
deleted, logged as a `llama_cache.disk.damaged` warning with its reason, and the lookup goes on with
the next best entry (a miss, `KeyError`, when none is left). Capacity and eviction are diskcache's
(`size_limit=capacity_bytes`, its default eviction policy); `cache_size` is `diskcache.Cache.volume()`.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import diskcache
import numpy as np

from caches.llama_cache.base import DEFAULT_CAPACITY_BYTES, BaseLlamaCache, common_prefix_len
from caches.tokens import tokens_from_bytes, tokens_to_bytes
from runtime.errors import StateFormatError
from runtime.log import get_logger

if TYPE_CHECKING:
    from llama_cpp.llama import LlamaState

__all__ = ["LlamaDiskCache", "StateFormatError", "decode_key", "decode_state", "encode_key", "encode_state"]

log = get_logger(__name__)

MAGIC = b"LCST"
VERSION = 1
_HEAD = struct.Struct("<4sHHqqQQQQQ")
_CRC = struct.Struct("<I")

_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")


def encode_key(tokens: Sequence[int]) -> bytes:
    """A token sequence as the disk cache's key: little-endian int32 bytes (`OverflowError` if a token does not fit)."""
    return tokens_to_bytes(tokens)


def decode_key(raw: bytes) -> tuple[int, ...]:
    """The token sequence of a disk cache key."""
    try:
        return tokens_from_bytes(raw)
    except ValueError as e:
        raise StateFormatError("key", str(e)) from None


def encode_state(value: LlamaState) -> bytes:
    """A `LlamaState` as bytes (see the module docstring for the layout)."""
    ids = np.asarray(value.input_ids)
    if ids.ndim != 1:
        raise ValueError(f"input_ids must be 1-D, got shape {ids.shape}")
    if ids.size and (int(ids.min()) < -(1 << 31) or int(ids.max()) >= (1 << 31)):
        raise ValueError("input_ids do not fit in int32")
    scores = np.asarray(value.scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be 2-D, got shape {scores.shape}")
    state = bytes(value.llama_state)
    try:
        head = _HEAD.pack(
            MAGIC,
            VERSION,
            0,
            int(value.n_tokens),
            int(value.seed),
            int(value.llama_state_size),
            ids.shape[0],
            scores.shape[0],
            scores.shape[1],
            len(state),
        )
    except struct.error as e:
        raise ValueError(f"state header does not fit its format: {e}") from e
    body = b"".join((head, ids.astype(_I32).tobytes(), scores.astype(_F32).tobytes(), state))
    return body + _CRC.pack(zlib.crc32(body))


def decode_state(data: bytes) -> LlamaState:
    """The `LlamaState` encoded in `data`; `StateFormatError` when it is not a valid, intact encoding."""
    from llama_cpp.llama import LlamaState

    if len(data) < _HEAD.size + _CRC.size:
        raise StateFormatError("truncated", f"{len(data)} bytes")
    magic, version, _, n_tokens, seed, state_size, n_ids, rows, cols, n_state = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise StateFormatError("magic", repr(magic))
    if version != VERSION:
        raise StateFormatError("version", str(version))
    body_len = len(data) - _CRC.size
    (crc,) = _CRC.unpack_from(data, body_len)
    if zlib.crc32(memoryview(data)[:body_len]) != crc:
        raise StateFormatError("checksum")
    ids_off = _HEAD.size
    scores_off = ids_off + 4 * n_ids
    state_off = scores_off + 4 * rows * cols
    if state_off + n_state != body_len:
        raise StateFormatError("length", f"fields need {state_off + n_state} bytes, body has {body_len}")
    if state_size > n_state or n_tokens < 0:
        raise StateFormatError("header", f"n_tokens={n_tokens} llama_state_size={state_size} of {n_state}")
    ids = np.frombuffer(data, dtype=_I32, count=n_ids, offset=ids_off).astype(np.intc)
    scores = np.frombuffer(data, dtype=_F32, count=rows * cols, offset=scores_off).astype(np.single)
    return LlamaState(
        input_ids=ids,
        scores=scores.reshape(rows, cols),
        n_tokens=n_tokens,
        llama_state=bytes(data[state_off : state_off + n_state]),
        llama_state_size=state_size,
        seed=seed,
    )


class LlamaDiskCache(BaseLlamaCache):
    """Disk-backed cache of `LlamaState`s in a diskcache directory; survives the process.

    Lookup picks the cached key with the longest non-empty common prefix with the query (a scan of the
    keys). Call `close()` when done with it.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] = ".cache/llama_cache",
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        verbose: bool = False,
    ) -> None:
        super().__init__(capacity_bytes)
        self.cache_dir = os.fspath(cache_dir)
        self.cache = diskcache.Cache(self.cache_dir, size_limit=capacity_bytes)
        self.verbose = verbose

    def _event(self, event: str, **kw: Any) -> None:
        (log.info if self.verbose else log.debug)(event, cache="disk", **kw)

    @property
    def cache_size(self) -> int:
        return int(self.cache.volume())

    def __len__(self) -> int:
        return len(self.cache)

    def close(self) -> None:
        """Close the diskcache handle (the directory and its entries stay)."""
        self.cache.close()

    def _raw_keys(self) -> Iterator[bytes]:
        for k in self.cache.iterkeys():
            if isinstance(k, bytes) and len(k) % 4 == 0:
                yield k

    def _find_best_raw_key(self, query: bytes, exclude: set[bytes] | None = None) -> bytes | None:
        if len(self.cache) == 0:
            return None
        n_query = len(query) // 4
        best_len, best = 0, None
        for k in self._raw_keys():
            if exclude and k in exclude:
                continue
            n = common_prefix_len(k, query) // 4
            if n > best_len:
                best_len, best = n, k
                if n == n_query:  # nothing can share more
                    break
        return best

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        raw = self._find_best_raw_key(encode_key(key))
        return None if raw is None else decode_key(raw)

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        if len(self.cache) == 0:
            raise KeyError("Cache is empty")
        query = encode_key(key)
        tried: set[bytes] = set()
        while True:
            raw = self._find_best_raw_key(query, tried)
            if raw is None:
                self._event("llama_cache.miss", query_len=len(query) // 4)
                raise KeyError("Key not found")
            tried.add(raw)
            data = self.cache.get(raw, default=None, retry=True)
            try:
                if data is None:
                    raise StateFormatError("missing", "the entry vanished or its file is unreadable")
                if not isinstance(data, bytes):
                    raise StateFormatError("type", f"stored value is a {type(data).__name__}, not bytes")
                state = decode_state(data)
            except StateFormatError as e:
                log.warning(
                    "llama_cache.disk.damaged",
                    reason=e.reason,
                    detail=str(e),
                    key_len=len(raw) // 4,
                    cache_dir=self.cache_dir,
                )
                self.cache.delete(raw, retry=True)
                continue
            self._event(
                "llama_cache.hit",
                query_len=len(query) // 4,
                key_len=len(raw) // 4,
                matched=common_prefix_len(raw, query) // 4,
                nbytes=len(data),
            )
            return state

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_best_raw_key(encode_key(key)) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        raw = encode_key(key)
        data = encode_state(value)
        self.cache.set(raw, data, retry=True)
        self._event("llama_cache.save", key_len=len(raw) // 4, nbytes=len(data))
