"""turnstile's runtime: the engine, the slot executor, the scheduler and the Runtime facade."""

from runtime.api import Runtime, RuntimeStats
from runtime.errors import (
    ContextOverflow,
    DecodeError,
    InvalidConfig,
    InvalidRequest,
    ModelLoadError,
    QueueFull,
    RequestTimeout,
    RuntimeClosed,
    TurnstileError,
)
from runtime.logs import configure_logging
from runtime.reply import Reply, Timings, Usage

__all__ = [
    "ContextOverflow",
    "DecodeError",
    "InvalidConfig",
    "InvalidRequest",
    "ModelLoadError",
    "QueueFull",
    "Reply",
    "RequestTimeout",
    "Runtime",
    "RuntimeClosed",
    "RuntimeStats",
    "Timings",
    "TurnstileError",
    "Usage",
    "configure_logging",
]
