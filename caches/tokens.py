"""Token-sequence helpers shared by every cache: the common prefix, the int32 codec, the keep rule.

`f32` / `fdiv` reproduce C++ `float` arithmetic, because llama-server computes its cache ratios in
`float` and a decision on the edge (a fraction that rounds across 0.25 or 0.5) must come out the same.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Sequence

__all__ = ["KEEP_MIN", "f32", "fdiv", "keeps_enough", "lcp", "tokens_from_bytes", "tokens_to_bytes"]

KEEP_MIN = 0.25
"""llama-server's prompt cache never loads an entry that would keep under a quarter of itself."""

_F32 = struct.Struct("f")
_TOKEN = "i"  # int32 on every platform CPython supports

assert array(_TOKEN).itemsize == 4


def f32(x: float) -> float:
    """Round to IEEE single precision, as a C++ `float` holds it."""
    if math.isnan(x) or math.isinf(x):
        return x
    try:
        return float(_F32.unpack(_F32.pack(x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def fdiv(a: float, b: float) -> float:
    """`float(a) / float(b)` in single precision (0/0 is NaN, as in C++)."""
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a)
    # Each operand is a float first; one correctly rounded double op then rounded to float is the float op.
    return f32(f32(a) / f32(b))


def keeps_enough(n_kept: int, n_tokens: int) -> bool:
    """Whether an entry of `n_tokens` that keeps `n_kept` of them may be loaded (kept fraction >= 0.25)."""
    return fdiv(n_kept, n_tokens) >= KEEP_MIN


def lcp(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the longest common prefix of two token sequences (or two bytes strings, or two strings).

    Compares slices (C loops) and bisects on the first mismatch instead of a Python loop per token:
    O(K) element comparisons, O(log K) Python steps. Bytes: one XOR of the two as big integers, whose
    highest set bit is in the first differing byte.
    """
    if isinstance(a, bytes) and isinstance(b, bytes):
        n = min(len(a), len(b))
        diff = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
        return n - (diff.bit_length() + 7) // 8
    if not isinstance(a, list | tuple | str) or type(a) is not type(b):
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def tokens_to_bytes(tokens: Sequence[int]) -> bytes:
    """Tokens as little-endian int32 (`OverflowError` if a token does not fit)."""
    arr = array(_TOKEN, tokens)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def tokens_from_bytes(raw: bytes | memoryview) -> tuple[int, ...]:
    """The tokens of `tokens_to_bytes` output; `ValueError` if the length is not a multiple of 4."""
    if len(raw) % 4:
        raise ValueError(f"{len(raw)} bytes is not a whole number of int32 tokens")
    arr = array(_TOKEN)
    arr.frombytes(raw)
    if sys.byteorder == "big":
        arr.byteswap()
    return tuple(arr)
