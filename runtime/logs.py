"""The one-line opt-in to see turnstile's events: `configure_logging("info")`. The library never calls it.

Events go to stdlib loggers under `turnstile` (see `sessions.log`); this attaches one handler to that
logger that writes `time level event key=value ...` lines (or JSON objects) to a stream, stderr by default.
Calling it again replaces the handler.
"""

from __future__ import annotations

import datetime as _dt
import json as _json
import logging
import sys
from typing import Any, TextIO

from sessions.errors import InvalidConfig
from sessions.log import ROOT, get_logger

__all__ = ["configure_logging", "get_logger"]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


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
