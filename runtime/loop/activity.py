"""What the slot is doing now, for watchers (the web page's engine view): the running request's phase and
progress. The slot's worker thread writes it, the event loop reads it; each write replaces one frozen
snapshot (a single attribute store), so a reader never sees half an update and nobody waits on a lock.

Phases: "starting" (rendering, tokenizing, the cache's decision), "prefill" (`done` of `total` prompt
tokens in the slot, `cached` of them reused), "decoding" (`generated` pieces so far).
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Activity", "Progress"]

Phase = Literal["starting", "prefill", "decoding"]


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """The running request's progress (a snapshot)."""

    request_id: int
    phase: Phase = "starting"
    cached: int = 0  # prompt tokens reused (the slot, a cache tier or a checkpoint)
    done: int = 0  # prompt tokens in the slot so far (cached included)
    total: int = 0  # prompt tokens
    generated: int = 0  # pieces generated so far


class Activity:
    """The running request's `Progress`, or None between requests."""

    def __init__(self) -> None:
        self.now: Progress | None = None

    def start(self, request_id: int) -> None:
        self.now = Progress(request_id=request_id)

    def prefill(self, request_id: int, done: int, total: int) -> None:
        """Worker thread: `done` of `total` prompt tokens are in the slot (the first call: the reused prefix)."""
        now = self.now
        if now is None or now.request_id != request_id:
            return
        cached = done if now.phase == "starting" else now.cached
        self.now = msgspec.structs.replace(now, phase="prefill", cached=cached, done=done, total=total)

    def piece(self, request_id: int) -> None:
        """Worker thread: one more piece generated."""
        now = self.now
        if now is None or now.request_id != request_id:
            return
        self.now = msgspec.structs.replace(now, phase="decoding", done=now.total, generated=now.generated + 1)

    def stop(self, request_id: int) -> None:
        if self.now is not None and self.now.request_id == request_id:
            self.now = None
