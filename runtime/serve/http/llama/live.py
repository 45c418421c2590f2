"""What llama-server adds to streamed events while a reply is generated: `timings` on every event with
`timings_per_token` (its `result_timings`: cache_n, prompt_n and ms, predicted_n and ms, and their rates, so
far), and `prompt_progress` events with `return_progress` ({"total", "cache", "processed", "time_ms"}, the cached
tokens first, then one per n_batch chunk of the prefill).

The clock runs on the event loop from the stream's own items: the prefill's `Progress` reports (or the turn's
`Started`) and the pieces; a reply's final event has the slot's own timings (`chat.convert.timings`)."""

from __future__ import annotations

import time
from typing import Any

from runtime.reply import ProbText, Progress, Started

__all__ = ["TokenClock", "progress_json"]


def progress_json(p: Progress) -> dict[str, Any]:
    """llama-server's `prompt_progress`."""
    return {"total": p.prompt_tokens, "cache": p.cached_tokens, "processed": p.processed, "time_ms": p.seconds * 1000}


class TokenClock:
    """Counts a stream's prompt and generated tokens and times them, for `timings` on each event."""

    def __init__(self, prompt_tokens: int = 0) -> None:
        self.t0 = time.perf_counter()
        self.prompt_tokens = prompt_tokens
        self.cached = 0
        self.t_first: float | None = None
        self.predicted = 0
        self.report: Progress | None = None  # the last prefill report before the first token

    def start(self, item: Started) -> None:
        """The slot took the turn (its prompt and cached tokens), or a prefill report came."""
        if self.predicted == 0 and self.t_first is None:
            self.prompt_tokens, self.cached = item.prompt_tokens, item.cached_tokens
            self.report = item if isinstance(item, Progress) else None

    def piece(self, item: str) -> None:
        """A generated piece: its tokens (one, or the tokens whose probabilities it carries)."""
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.predicted += max(1, len(item.probs)) if isinstance(item, ProbText) else 1

    def timings(self) -> dict[str, Any]:
        """llama-server's `timings` so far (during the prefill: the tokens prefilled so far, none predicted)."""
        now = time.perf_counter()
        first = self.t_first if self.t_first is not None else now
        prompt_n = max(0, self.prompt_tokens - self.cached)
        prompt_ms, predicted_ms = (first - self.t0) * 1000, (now - first) * 1000
        if self.t_first is None and self.report is not None:
            prompt_n = self.report.processed - self.report.cached_tokens
            prompt_ms = self.report.seconds * 1000 if prompt_n else 0.0
        return {
            "cache_n": self.cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / self.predicted if self.predicted else 0.0,
            "predicted_per_second": self.predicted / predicted_ms * 1000 if predicted_ms > 0 else 0.0,
        }
