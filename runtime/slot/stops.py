"""Stop strings, as llama-server applies them: the stop string and what follows it never reach the caller.

While streaming, text that could be the start of a stop string is held back until it is known not to be.
"""

from __future__ import annotations

from collections.abc import Sequence


def partial_stop_at(text: str, stop: str) -> int:
    """Where a proper prefix of `stop` ends `text`, or -1 (llama.cpp's string_find_partial_stop)."""
    if not text or not stop:
        return -1
    for n in range(min(len(stop), len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return len(text) - n
    return -1


class StopMatcher:
    """Accumulates generated text; `feed` returns what may be sent and whether a stop string was hit."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.text = ""  # everything generated, stop string cut off once found
        self.sent = 0  # how much of `text` was handed out
        self.stopped_by: str | None = None

    def feed(self, piece: str, *, final: bool = False) -> str:
        """Add a piece; returns the text that can be sent now (a held-back tail is sent when `final`)."""
        if not self.stops:  # nothing to hold back: the piece goes out as it is
            self.text += piece
            self.sent = len(self.text)
            return piece
        self.text += piece
        if self.stopped_by is None and self.stops:
            tail_from = max(0, self.sent - max(len(s) for s in self.stops))
            best = -1
            for s in self.stops:
                pos = self.text.find(s, tail_from)
                if pos != -1 and (best == -1 or pos < best):
                    best, self.stopped_by = pos, s
            if best != -1:
                self.text = self.text[:best]
                return self._send(len(self.text))
            if not final:
                hold = min(
                    (p for s in self.stops if (p := partial_stop_at(self.text, s)) != -1), default=len(self.text)
                )
                return self._send(max(hold, self.sent))
        return self._send(len(self.text))

    def _send(self, upto: int) -> str:
        out = self.text[self.sent : upto]
        self.sent = max(self.sent, upto)
        return out
