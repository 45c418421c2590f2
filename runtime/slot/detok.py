"""Incremental, UTF-8 safe detokenization: bytes in, complete characters out."""

from __future__ import annotations

import codecs


class IncrementalText:
    """Feeds token pieces (bytes) and yields only complete UTF-8 text; holds back partial characters."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._decoder.decode(piece)

    @property
    def pending(self) -> bool:
        """Whether the bytes fed so far end inside a character (held back until it completes)."""
        return bool(self._decoder.getstate()[0])

    def flush(self) -> str:
        """Whatever is left at the end (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
