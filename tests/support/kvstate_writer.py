"""Sequence states in llama.cpp's layout, written independently of `caches.kvstate` for model-free tests.

A cell's bytes are a function of the tokens up to it (and the layer), as a real KV cache's are of the
prefix: states that share a prefix of tokens share those cells' bytes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from caches.kvstate import MAGIC
from caches.tokens import tokens_to_bytes

K_ROW = 16  # f16, 8 wide
V_ROW = 8  # f16, 4 wide
LAYERS = 2


def _cell(tokens: Sequence[int], i: int, what: str, n: int, salt: bytes) -> bytes:
    h = hashlib.shake_128(salt + what.encode() + tokens_to_bytes(tokens[: i + 1]))
    return h.digest(n)


def kv_state(
    tokens: Sequence[int], *, seq: int = 0, v_trans: bool = False, salt: bytes = b"", tail: bytes = b""
) -> bytes:
    """A llama_kv_cache sequence state holding `tokens` at positions 0..n-1, then `tail` (whole sections)."""
    n = len(tokens)
    out = bytearray(struct.pack("<IiII", MAGIC, seq, 1, n))
    if n:
        for p in range(n):
            out += struct.pack("<iIi", p, 1, seq)
        out += struct.pack("<II", int(v_trans), LAYERS)
        for il in range(LAYERS):
            out += struct.pack("<iQ", 1, K_ROW) + b"".join(_cell(tokens, i, f"k{il}", K_ROW, salt) for i in range(n))
        for il in range(LAYERS):
            cells = [_cell(tokens, i, f"v{il}", V_ROW, salt) for i in range(n)]
            if v_trans:
                out += struct.pack("<iII", 1, 2, V_ROW // 2)
                out += b"".join(c[2 * j : 2 * j + 2] for j in range(V_ROW // 2) for c in cells)
            else:
                out += struct.pack("<iQ", 1, V_ROW) + b"".join(cells)
    return bytes(out + tail)


CELL_BYTES = 12 + LAYERS * (K_ROW + V_ROW)
"""Payload bytes per cell of `kv_state`."""


FRAME_BYTES = 16 + 8 + LAYERS * 12 + LAYERS * 12
"""Bytes of a `kv_state` (V not transposed, no tail) outside its cells."""
