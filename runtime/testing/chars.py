"""One token a character: the vocabulary of the model-less slot backends (`ScriptedBackend` and its
subclasses in tests, the pytest plugin's replay), and the slot result of a reply that computed nothing.

A token is a code point (`ord`), so a prompt's token count is its length and any text round-trips; a
surrogate or an out-of-range id is not a token (`InvalidRequest`, as a real vocabulary refuses an unknown id).
"""

from __future__ import annotations

from runtime.backend.protocol import SlotResult
from runtime.errors import InvalidRequest
from runtime.types import CacheSource, FinishReason

__all__ = ["char_piece", "char_tokens", "computed_nothing"]


def char_tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


def char_piece(token: int) -> bytes:
    """The UTF-8 bytes of token `token` (a code point)."""
    if not 0 <= token < 0x110000 or 0xD800 <= token < 0xE000:
        raise InvalidRequest(f"token {token} is not a character")
    return chr(token).encode()


def computed_nothing(
    text: str,
    finish: FinishReason,
    *,
    tokens: list[int],
    prompt_tokens: int,
    cached_tokens: int,
    cache_source: CacheSource,
) -> SlotResult:
    """A slot result with no time spent and no state saved or restored (what a scripted or replayed reply is)."""
    return SlotResult(
        text=text,
        finish_reason=finish,
        tokens=tokens,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        prefilled_tokens=prompt_tokens - cached_tokens,
        cache_source=cache_source,
        bytes_saved=0,
        bytes_restored=0,
        t_cache=0.0,
        t_prefill=0.0,
        t_decode=0.0,
        t_first_token=None,
    )
