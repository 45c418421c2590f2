"""Token probabilities as llama-server writes them (`completion_token_output::probs_vector_to_json`): per
generated token `{"id", "token", "bytes", "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"}]}`,
or with `post_sampling_probs` `"prob"` and `"top_probs"`. OpenAI's chat `logprobs.content` is the same list
(its fields are a subset). A probability of 0 has the lowest float as its logprob (JSON has no -inf)."""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from typing import Any

from runtime.reply import Candidate, TokenProb

__all__ = ["probs_json", "trim_stop"]

_LOWEST = -3.4028234663852886e38  # std::numeric_limits<float>::lowest()


def _log(p: float) -> float:
    return math.log(p) if p > 0 else _LOWEST


def _text(raw: bytes) -> str:
    """The bytes as text, an incomplete character at the end dropped (llama-server's validate_utf8)."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(raw, final=False)


def _candidate(c: Candidate, post: bool) -> dict[str, Any]:
    key, value = ("prob", c.p) if post else ("logprob", _log(c.p))
    return {"id": c.token, "token": _text(c.piece), "bytes": list(c.piece), key: value}


def probs_json(probs: Sequence[TokenProb], *, post: bool, top: int | None = None) -> list[dict[str, Any]]:
    """The probabilities of `probs` in llama-server's shape; `top` cuts each token's list (OpenAI's
    top_logprobs, when it asked for fewer than were computed)."""
    out = []
    for e in probs:
        raw = e.text.encode("utf-8")
        key, value = ("prob", e.p) if post else ("logprob", _log(e.p))
        cands = e.top if top is None else e.top[:top]
        out.append(
            {
                "id": e.token,
                "token": e.text,
                "bytes": list(raw),
                key: value,
                "top_probs" if post else "top_logprobs": [_candidate(c, post) for c in cands],
            }
        )
    return out


def trim_stop(probs: Sequence[TokenProb], stop_tokens: int) -> Sequence[TokenProb]:
    """llama-server's non-streamed reply ended by a stop string drops as many tokens' probabilities as the
    stop string has tokens."""
    return probs[: max(0, len(probs) - stop_tokens)] if stop_tokens else probs
