"""Names shared across the runtime, defined once: why a turn ended, where its state came from, what a
request is, which cache rules the slot follows."""

from __future__ import annotations

import enum
from typing import Literal

__all__ = [
    "CACHE_RULES",
    "MAX_SESSIONS",
    "SPECULATIVE",
    "CacheRules",
    "CacheSource",
    "FinishReason",
    "RequestKind",
    "Speculative",
    "SpeculativeChoice",
    "speculation_flag",
]

MAX_SESSIONS = 64
"""Sessions whose rendered prompt is kept (a state holds the prompt's messages, its text and tokens: about
40 bytes per token, kept as a list so that a prompt is a copy of pointers, not new ints)."""

FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]
CacheSource = Literal["slot", "ram", "disk", "checkpoint", "none"]
CacheRules = Literal["turnstile", "llama-server"]
CACHE_RULES: tuple[CacheRules, ...] = ("turnstile", "llama-server")
Speculative = Literal["ngram"] | None  # draft-less speculative decoding from the conversation's n-grams, or off
SPECULATIVE: tuple[Speculative, ...] = ("ngram", None)
SpeculativeChoice = Literal["ngram", "none"]  # a session's or a turn's speculation: on or off (None: the runtime's)


def speculation_flag(choice: str | None) -> bool | None:
    """A session's or a turn's choice as the slot request's flag: True on, False off, None the slot's setting."""
    return None if choice is None else choice == "ngram"


class RequestKind(enum.StrEnum):
    """What a queued request does: a turn (chat, regenerate, edit, complete) or a store operation."""

    CHAT = "chat"
    REGENERATE = "regenerate"
    EDIT = "edit"
    COMPLETE = "complete"  # a reply to a given message list (stateless, or committed as a named transcript)
    OP = "op"

    @property
    def is_turn(self) -> bool:
        return self is not RequestKind.OP
