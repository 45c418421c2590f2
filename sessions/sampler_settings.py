"""llama-server's further sampler settings as `Sampling` fields: their names, neutral values and checks.

These are the knobs of llama.cpp's sampler chain beyond temperature, top-k, top-p, min-p and the penalties
(`typical_p`, `mirostat*`, `dry_*`, `xtc_*`, `dynatemp_*`, `top_n_sigma`, `min_keep`, the chain's order
`samplers`, `logit_bias`), plus what a reply reports of the chain (`n_probs`, `post_sampling_probs`). Each
default is llama-server's and leaves the chain as it is without it (`runtime.llama.sampler`).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["CHAIN_NAMES", "DEFAULT_ORDER", "MAX_LOGIT_BIAS", "MAX_N_PROBS", "sampler_problem"]

# llama-server's sampler names (common_sampler_types_from_names' canonical ones) that turnstile chains
CHAIN_NAMES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
DEFAULT_ORDER = CHAIN_NAMES  # llama-server's default `samplers` order
MAX_N_PROBS = 1024  # the most probabilities a reply reports per token
MAX_LOGIT_BIAS = 1 << 16  # the most (token, bias) pairs of one request

_FLOATS = {
    "typical_p": None,
    "top_n_sigma": None,
    "xtc_probability": (0.0, 1.0),
    "xtc_threshold": (0.0, 1.0),
    "dynatemp_range": None,
    "dynatemp_exponent": None,
    "mirostat_tau": None,
    "mirostat_eta": None,
    "dry_multiplier": None,
    "dry_base": None,
}
_INTS = {
    "min_keep": (0, 1 << 20),
    "mirostat": (0, 2),
    "dry_allowed_length": (0, 1 << 30),
    "dry_penalty_last_n": (0, 1 << 30),
    "n_probs": (0, MAX_N_PROBS),
}
NAMES = frozenset({*_FLOATS, *_INTS, "dry_sequence_breakers", "samplers", "logit_bias", "post_sampling_probs"})


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def sampler_problem(name: str, value: Any) -> str | None:
    """Why `value` is not valid for sampler setting `name` (None: it is); "not a sampling setting" for other
    names."""
    if name in _FLOATS:
        if not _number(value) or not math.isfinite(value):
            return "must be a finite number"
        bounds = _FLOATS[name]
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return f"must be in [{bounds[0]}, {bounds[1]}]"
        return None
    if name in _INTS:
        low, high = _INTS[name]
        return None if _int(value) and low <= value <= high else f"must be an int in [{low}, {high}]"
    if name == "post_sampling_probs":
        return None if isinstance(value, bool) else "must be a bool"
    if name == "dry_sequence_breakers":
        if not isinstance(value, tuple) or not value or len(value) > 64:
            return "must be a non-empty tuple (or list) of at most 64 strings"
        ok = all(isinstance(s, str) and 0 < len(s) <= 256 for s in value)
        return None if ok else "each sequence breaker must be a non-empty str of at most 256 characters"
    if name == "samplers":
        if not isinstance(value, tuple) or len(value) > 32:
            return "must be a tuple (or list) of at most 32 sampler names"
        bad = [s for s in value if s not in CHAIN_NAMES]
        return None if not bad else f"unknown or unsupported sampler {bad[0]!r} (known: {', '.join(CHAIN_NAMES)})"
    if name == "logit_bias":
        if not isinstance(value, tuple) or len(value) > MAX_LOGIT_BIAS:
            return f"must be a tuple of at most {MAX_LOGIT_BIAS} (token id, bias) pairs"
        for pair in value:
            if not (isinstance(pair, tuple) and len(pair) == 2 and _int(pair[0]) and pair[0] >= 0):
                return "each entry must be a (token id >= 0, bias) pair"
            bias = pair[1]
            if not _number(bias) or math.isnan(bias) or bias == math.inf:
                return "each bias must be a finite number, or -inf to ban the token"
        return None
    return "not a sampling setting"


def _bias(value: Any) -> Any:
    """A bias as stored: a float; `false` (llama-server's ban, and how an export writes one) is -inf."""
    if value is False:
        return -math.inf
    return float(value) if _number(value) else value


def coerce(name: str, value: Any) -> Any:
    """What `Sampling.with_overrides` stores for `value`: lists become tuples, ints become floats."""
    if name in _FLOATS and _int(value):
        return float(value)
    if name in ("dry_sequence_breakers", "samplers") and isinstance(value, list):
        return tuple(value)
    if name == "logit_bias" and isinstance(value, list | tuple):
        return tuple((p[0], _bias(p[1])) if isinstance(p, list | tuple) and len(p) == 2 else p for p in value)
    return value
