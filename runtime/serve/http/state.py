"""What the HTTP app shares between requests: the Runtime (None while the model loads), whether the
server is closing, and the HTTP counters that /metrics reports."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from runtime.api import Runtime
from runtime.serve.http.errors import ApiError
from runtime.serve.http.tolerance import UnknownFields

__all__ = ["ServeState"]


@dataclass
class ServeState:
    """The app's state. A server sets `runtime` once the model is loaded and `closing` on SIGTERM."""

    runtime: Runtime | None = None
    closing: bool = False
    model_name: str | None = None
    normalize: bool = True  # the named normalizations of volatile prompt spans (runtime.serve.http.normalize)
    started: float = field(default_factory=time.time)
    responses: Counter[tuple[str, int]] = field(default_factory=Counter)  # (path, status) -> count
    responses_by_key: Counter[tuple[str, int]] = field(default_factory=Counter)  # (key name, status) -> count
    disconnects: int = 0  # chat requests whose client went away before the reply
    unknown_fields: UnknownFields = field(default_factory=UnknownFields)  # ignored top-level request fields
    _ids: int = 0

    def require(self) -> Runtime:
        """The Runtime, or a 503 while loading or closing."""
        if self.closing:
            raise ApiError.unavailable("the server is shutting down")
        if self.runtime is None:
            raise ApiError.unavailable("the model is loading")
        return self.runtime

    @property
    def model(self) -> str:
        if self.model_name:
            return self.model_name
        return self.runtime.model_name if self.runtime is not None else "turnstile"

    def next_id(self) -> str:
        self._ids += 1
        return f"chatcmpl-{int(self.started)}-{self._ids}"
