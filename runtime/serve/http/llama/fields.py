"""llama-server's request fields that would change a reply and that turnstile does not do: each is refused
with a 400 naming it when given a value other than its neutral one (never silently ignored), on chat
completions and on the completion routes alike. (The sampler fields and probabilities are done:
`runtime.serve.http.llama.sampler_fields`.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runtime.serve.http.errors import ApiError

__all__ = ["REFUSED", "refuse_unsupported"]


def _nonzero(v: Any) -> bool:
    return v not in (None, 0, 0.0, False)


def _given(v: Any) -> bool:
    return bool(v)


# field -> whether the value given would change the reply
REFUSED: dict[str, Callable[[Any], bool]] = {
    "n_indent": _nonzero,
    "lora": _given,
    "multimodal_data": _given,
    "n_cmpl": lambda v: v not in (None, 1),
    "best_of": lambda v: v not in (None, 1),
    "n": lambda v: v not in (None, 1),
}


def refuse_unsupported(values: Mapping[str, Any]) -> None:
    """ApiError 400 for the first field of REFUSED given with a value that would change the reply."""
    for name, changes in REFUSED.items():
        if name in values and changes(values[name]):
            if name == "n":
                raise ApiError.bad_request("only n=1 is supported (one choice per request)", param="n")
            raise ApiError.bad_request(
                f"{name!r} is not supported by turnstile (it would change the reply); leave it out", param=name
            )
