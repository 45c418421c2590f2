"""The per-request speculation fields, the same in every dialect (chat completions, Responses, Messages).

- `"speculative": "ngram" | "none"`: turnstile's own, n-gram speculation on or off for this request (null or
  absent: the session's choice, else the server's `--spec`). Another value is a 400 (`param: speculative`,
  from the Runtime's check).
- `"speculative.n_max"`: llama-server's per-request draft limit. `0` turns speculation off, as it does there;
  a positive value is accepted and changes nothing (turnstile's draft length adapts to the acceptance rate
  and has no per-request cap); a negative one, or `0` beside `"speculative": "ngram"`, is a 400.

llama-server's other `speculative.*` fields (`n_min`, `p_min`, `type`, the n-gram sizes) tune drafters
turnstile does not have; chat completions and Messages ignore them as any unknown field, Responses (which
refuses unknown fields) refuses them.
"""

from __future__ import annotations

from typing import Any

from runtime.serve.http.errors import ApiError

__all__ = ["N_MAX", "speculative_option"]

N_MAX = "speculative.n_max"  # llama-server's field name (a dot in it: a msgspec field rename)


def speculative_option(choice: str | None, n_max: int | None) -> dict[str, Any]:
    """The Runtime keyword for a request's speculation fields (nothing when it asks nothing)."""
    if n_max is not None:
        if n_max < 0:
            raise ApiError.bad_request(f"{N_MAX} must be >= 0 (0: speculation off), not {n_max}", param=N_MAX)
        if n_max == 0:
            if choice == "ngram":
                raise ApiError.bad_request(f'"speculative": "ngram" contradicts {N_MAX} 0 (off)', param=N_MAX)
            return {"speculative": "none"}
    return {} if choice is None else {"speculative": choice}
