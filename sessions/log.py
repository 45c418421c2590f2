"""The library's loggers: structlog events on stdlib `logging` loggers named `turnstile.<module>`.

A library is quiet: with nothing configured, Python's logging shows only WARNING and above (on stderr),
so an app that embeds turnstile sees none of its info or debug events. An app that configures `logging`
(or structlog on top of it) gets every event: the record's message is `event key=value ...` and the
record carries `event` and `fields` (the key/value pairs, `session_id` and `request_id` included, from
structlog's contextvars) for structured handlers. `runtime.configure_logging(level)` is the one-line
opt-in that the CLI uses.

This lives in `sessions`, the lowest package, so that `caches` and `sessions` log the same way.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

__all__ = ["ROOT", "get_logger"]

ROOT = "turnstile"


def _text(value: object) -> str:
    """A value as key=value shows it: plain words and numbers bare, anything else as its repr."""
    if isinstance(value, str):
        return value if value and not any(c in value for c in " =\"'\n") else repr(value)
    return str(value) if isinstance(value, int | float | bool) or value is None else repr(value)


def _to_stdlib(_logger: Any, _method: str, event_dict: Any) -> tuple[tuple[str], dict[str, Any]]:
    """The last processor: one stdlib record with a readable message and the fields as attributes."""
    event = str(event_dict.pop("event", ""))
    event_dict.pop("level", None)
    exc_info = event_dict.pop("exc_info", None)
    text = " ".join([event, *(f"{k}={_text(v)}" for k, v in event_dict.items())])
    kwargs: dict[str, Any] = {"extra": {"event": event, "fields": event_dict}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (text,), kwargs


def _captured(logger: Any, method: str, event_dict: Any) -> Any:
    """Inside `structlog.testing.capture_logs()`, hand every event to it (all levels) and stop there."""
    for processor in structlog.get_config()["processors"]:
        if isinstance(processor, structlog.testing.LogCapture):
            processor(logger, method, structlog.contextvars.merge_contextvars(logger, method, event_dict))
            raise structlog.DropEvent
    return event_dict


_PROCESSORS: list[Any] = [
    _captured,  # tests assert events with structlog's capture_logs(), whatever the logging levels
    structlog.stdlib.filter_by_level,  # first: an event below the logger's level costs one check
    structlog.contextvars.merge_contextvars,
    _to_stdlib,
]


def get_logger(name: str) -> Any:
    """A structlog logger for module `name` (e.g. `runtime.slot`), writing to the stdlib logger `turnstile.<name>`."""
    std = logging.getLogger(f"{ROOT}.{name}")
    return structlog.wrap_logger(std, processors=_PROCESSORS, wrapper_class=structlog.stdlib.BoundLogger)
