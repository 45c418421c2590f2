"""The chat benchmarks' workload and its driver: the settings every system shares, what a system reports
for one turn, and the round-robin play.

Every system answers the same schedule of turns (conversation c, turn t; `tests.support.workloads`)
with greedy decoding; each one builds every conversation's history from its own replies. A system is
anything with `turn(conv, messages) -> Outcome` and `close()` (the systems are in `benchmarks._systems`,
the table rows in `benchmarks._rows`, the command-line plumbing in `benchmarks._cli`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tests.support.workloads import Messages, messages

__all__ = [
    "N_BATCH",
    "N_CTX",
    "N_UBATCH",
    "SEED",
    "ChatSystem",
    "Conversations",
    "Factory",
    "Outcome",
    "Settings",
    "TurnRecord",
    "opened",
    "play",
]

N_CTX = 4096
N_BATCH = 2048
N_UBATCH = 512
SEED = 0


@dataclass(frozen=True)
class Settings:
    """What every system shares: the model, the context settings and the generation limits."""

    model: Path
    n_ctx: int = N_CTX
    threads: int = 2
    max_tokens: int = 48
    seed: int = SEED
    cache_type: str = "f16"  # K and V cache type of every system (llama-server -ctk/-ctv)
    n_gpu_layers: int = 0  # layers offloaded to the GPU by every system (llama-server -ngl)

    @property
    def runtime_options(self) -> dict[str, Any]:
        """The hardware keywords of `Runtime.open` for these settings."""
        return {"type_k": self.cache_type, "type_v": self.cache_type, "n_gpu_layers": self.n_gpu_layers}

    @property
    def server_args(self) -> list[str]:
        """The same for llama-server's command line."""
        return ["-ctk", self.cache_type, "-ctv", self.cache_type, "-ngl", str(self.n_gpu_layers)]

    @property
    def sampling(self) -> dict[str, Any]:
        return {"temperature": 0.0, "seed": self.seed, "max_tokens": self.max_tokens}


@dataclass(frozen=True)
class Outcome:
    """One turn as one system answered it."""

    text: str
    prompt_tokens: int
    prefilled: int
    generated: int
    ideal: int | None = None  # only turnstile can tell (its own token lists)


@dataclass(frozen=True)
class TurnRecord:
    conv: int
    turn: int
    outcome: Outcome
    seconds: float


class ChatSystem(Protocol):
    name: str

    def turn(self, conv: int, msgs: Messages) -> Outcome: ...

    def close(self) -> None: ...


Factory = Callable[[], ChatSystem]


@dataclass
class Conversations:
    """Each conversation's replies so far (the history a system builds from its own answers)."""

    replies: dict[tuple[int, int], str] = field(default_factory=dict)


def play(system: ChatSystem, turns: Sequence[tuple[int, int]], convs: Conversations) -> list[TurnRecord]:
    """Play the turns in order; every history comes from this system's own earlier replies."""
    out: list[TurnRecord] = []
    for c, t in turns:
        msgs = messages(c, t, convs.replies)
        t0 = time.perf_counter()
        o = system.turn(c, msgs)
        dt = time.perf_counter() - t0
        convs.replies[c, t] = o.text
        out.append(TurnRecord(c, t, o, dt))
    return out


@contextlib.contextmanager
def opened(factory: Factory) -> Iterator[ChatSystem]:
    """The system `factory` makes, closed at the end of the block."""
    system = factory()
    try:
        yield system
    finally:
        system.close()
