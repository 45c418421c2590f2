"""Errors the caches raise on purpose (all derive from `TurnstileError`)."""

from __future__ import annotations

from sessions.errors import TurnstileError

__all__ = ["DiskTierUnavailable"]


class DiskTierUnavailable(TurnstileError):
    """Raised when the disk tier's directory cannot be used: read-only, not a directory, a damaged cache.db."""

    def __init__(self, directory: str, reason: str) -> None:
        super().__init__(f"disk tier {directory!r} is unavailable: {reason}")
        self.directory = directory
        self.reason = reason
