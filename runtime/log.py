"""The library's loggers, and the one-line opt-in to see their events.

Events are structlog events on stdlib `logging` loggers named `turnstile.<module>`. A library is quiet:
with nothing configured, Python's logging shows only WARNING and above (on stderr), so an app that embeds
turnstile sees none of its info or debug events. An app that configures `logging` (or structlog on top of
it) gets every event: the record's message is `event key=value ...` and the record carries `event` and
`fields` (the key/value pairs, `session_id` and `request_id` included, from structlog's contextvars) for
structured handlers. `configure_logging(level)` is the one-line opt-in that the CLI uses; the library never
calls it.

Tests see every event, whatever the levels, with `capture_logs()` (structlog's `LogCapture` put in front
of the pipeline for the duration of the `with` block).

This module imports nothing of the project, so `sessions`, `caches` and `runtime` all log the same way.
"""

from __future__ import annotations

import datetime as _dt
import json as _json
import logging
import sys
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, TextIO

import structlog
from structlog.testing import LogCapture

from runtime.errors import InvalidConfig

__all__ = ["ROOT", "capture_logs", "configure_logging", "get_logger"]

ROOT = "turnstile"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


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


_captures: list[LogCapture] = []  # the innermost capture_logs() block last; empty outside tests


def _captured(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Inside `capture_logs()`, hand every event to the capture (all levels) and stop there."""
    if _captures:
        _captures[-1](logger, method, structlog.contextvars.merge_contextvars(logger, method, event_dict))
        raise structlog.DropEvent
    return event_dict


_PROCESSORS: list[Any] = [
    _captured,  # tests assert events with capture_logs(), whatever the logging levels (one list check)
    structlog.stdlib.filter_by_level,  # an event below the logger's level costs one check
    structlog.contextvars.merge_contextvars,
    _to_stdlib,
]


def get_logger(name: str) -> Any:
    """A structlog logger for module `name` (e.g. `runtime.slot`), writing to the stdlib logger `turnstile.<name>`."""
    std = logging.getLogger(f"{ROOT}.{name}")
    return structlog.wrap_logger(std, processors=_PROCESSORS, wrapper_class=structlog.stdlib.BoundLogger)


@contextmanager
def capture_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every turnstile event inside the block, as structlog's `LogCapture` records it (`event`, `log_level`,
    the fields); also what plain structlog loggers log there (through `structlog.testing.capture_logs`)."""
    with structlog.testing.capture_logs() as entries:
        capture = LogCapture()
        capture.entries = entries
        _captures.append(capture)
        try:
            yield entries
        finally:
            _captures.remove(capture)


class _Formatter(logging.Formatter):
    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        stamp = _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds")
        level = record.levelname.lower()
        if not self.as_json:
            return f"{stamp} [{level:<7}] {record.getMessage()}"
        fields: dict[str, Any] = getattr(record, "fields", {})
        doc = {"timestamp": stamp, "level": level, "event": getattr(record, "event", record.getMessage()), **fields}
        return _json.dumps(doc, default=repr)


_HANDLER_MARK = "_turnstile_handler"


def configure_logging(level: str = "warning", *, json: bool = False, stream: TextIO | None = None) -> None:
    """Send turnstile's events at `level` and above to `stream` (stderr), as key=value lines or JSON."""
    if level not in _LEVELS:
        raise InvalidConfig(f"log level must be one of {sorted(_LEVELS)}, not {level!r}")
    logger = logging.getLogger(ROOT)
    for h in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(_Formatter(json))
    logger.addHandler(handler)
    logger.setLevel(_LEVELS[level])
    logger.propagate = False
