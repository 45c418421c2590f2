"""The slot side as the event loop sees it: the `SlotBackend` protocol and the data it passes
(`runtime.backend.protocol`), and the llama.cpp implementation (`runtime.backend.llama`, which loads llama.cpp;
import it only to build a real backend)."""

from runtime.backend.protocol import GrammarSpec, RenderedChat, SlotBackend, SlotRequest, SlotResult, SlotStats

__all__ = ["GrammarSpec", "RenderedChat", "SlotBackend", "SlotRequest", "SlotResult", "SlotStats"]
