"""llama-server's sampler fields read from a request body into turnstile's sampling options, on the chat and
completion routes alike: `typical_p`, `min_keep`, `top_n_sigma`, `xtc_*`, `dynatemp_*`, `mirostat*`, `dry_*`,
`samplers` (names, their kebab-case and dash-less aliases, or a string of llama-server's sampler letters),
`post_sampling_probs`, and `logit_bias` in OpenAI's form (`{"token id": bias}`) and llama-server's (`[[id or
text, bias], ...]`, `{"text": bias}`; `false` bans). A value llama.cpp's chain cannot take is a 400 naming the
field (`sessions.sampler_settings` checks the ranges)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.api import Runtime
from runtime.serve.http.errors import ApiError
from sessions.sampler_settings import CHAIN_NAMES, coerce, sampler_problem

__all__ = ["FIELDS", "logit_bias", "reported_bias", "sampler_options"]

FIELDS = (
    "typical_p",
    "min_keep",
    "top_n_sigma",
    "xtc_probability",
    "xtc_threshold",
    "dynatemp_range",
    "dynatemp_exponent",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "samplers",
    "post_sampling_probs",
)

_CANONICAL = {*CHAIN_NAMES, "infill", "adaptive_p"}
_ALIASES: dict[str, str] = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical_p": "typ_p"}
for _name in _CANONICAL:
    if "_" in _name:
        _ALIASES[_name.replace("_", "-")] = _name
        _ALIASES[_name.replace("_", "")] = _name
_LETTERS = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
}


def _samplers(value: Any) -> tuple[str, ...]:
    """llama-server's `samplers`: names (an unknown one skipped, as llama-server does) or letters."""
    if isinstance(value, str):
        names = [_LETTERS[c] for c in value if c in _LETTERS]
    elif isinstance(value, list) and all(isinstance(n, str) for n in value):
        names = [n if n in _CANONICAL else _ALIASES[n] for n in value if n in _CANONICAL or n in _ALIASES]
    else:
        raise ApiError.bad_request(
            "'samplers' must be a list of sampler names or a string of letters", param="samplers"
        )
    for name in names:
        if name not in CHAIN_NAMES:
            raise ApiError.bad_request(f"sampler {name!r} is not supported by turnstile", param="samplers")
    return tuple(names)


def sampler_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling options for the sampler fields given (None: not given); ApiError 400 naming a bad one."""
    out: dict[str, Any] = {}
    for name in FIELDS:
        value = values.get(name)
        if value is None:
            continue
        if name == "samplers":
            value = _samplers(value)
        elif name == "dry_base" and isinstance(value, int | float) and not isinstance(value, bool) and value < 1.0:
            continue  # llama-server: a base below 1 is replaced by the default
        elif name == "dry_sequence_breakers" and value == []:
            raise ApiError.bad_request("'dry_sequence_breakers' must be a non-empty list of strings", param=name)
        problem = sampler_problem(name, coerce(name, value))
        if problem is not None:
            raise ApiError.bad_request(f"{name!r} {problem}", param=name)
        out[name] = coerce(name, value)
    return out


_INT_KEY = re.compile(r"[+-]?\d+")


def _bias(value: Any) -> float:
    if value is False:
        return -math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError.bad_request("each logit_bias value must be a finite number, or false to ban", param="logit_bias")
    return float(value)


async def logit_bias(rt: Runtime, value: Any) -> list[tuple[int, float]]:
    """(token id, bias) pairs for a request's `logit_bias`: a text stands for each of its tokens (tokenized
    without special tokens, as llama-server); a token id outside the vocabulary is a 400."""
    pairs: list[tuple[int | str, float]] = []
    if isinstance(value, dict):
        for key, raw in value.items():
            pairs.append((int(key) if _INT_KEY.fullmatch(key) else key, _bias(raw)))
    elif isinstance(value, list):
        for el in value:
            ok = isinstance(el, list) and len(el) == 2 and isinstance(el[0], int | str) and not isinstance(el[0], bool)
            if not ok:
                raise ApiError.bad_request("'logit_bias' pairs must be [token id or text, bias]", param="logit_bias")
            pairs.append((el[0], _bias(el[1])))
    else:
        raise ApiError.bad_request("'logit_bias' must be an object or a list of pairs", param="logit_bias")
    out: list[tuple[int, float]] = []
    for key, bias in pairs:
        if isinstance(key, str):
            out += [(t, bias) for t in await rt.tokenize(key, add_special=False, parse_special=False)]
        else:
            if key < 0:
                raise ApiError.bad_request(
                    f"logit_bias token id {key} is not a token of this model", param="logit_bias"
                )
            out.append((key, bias))
    try:
        await rt.token_pieces(sorted({t for t, _ in out}))
    except Exception as e:
        raise ApiError.bad_request(f"logit_bias: {e}", param="logit_bias") from None
    return out


def reported_bias(options: Mapping[str, Any], eog: Sequence[int]) -> list[dict[str, Any]]:
    """`generation_settings.logit_bias` as llama-server reports it: the request's biases, then with `ignore_eos`
    each end-of-generation token's; a ban's bias is null (JSON has no -inf)."""
    pairs = list(options.get("logit_bias", ()))
    if options.get("ignore_eos"):
        pairs += [(t, -math.inf) for t in eog]
    return [{"bias": None if b == -math.inf else b, "token": t} for t, b in pairs]
