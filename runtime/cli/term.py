"""Terminal helpers for the CLI: colour only on a terminal (and never with NO_COLOR), a spinner with elapsed
time on stderr, and plain-text tables. Nothing here knows about models or sessions.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TextIO

import anyio
import anyio.abc

_CODES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}
AGENT_COLOURS = ("cyan", "yellow", "magenta", "green", "blue", "red")
_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


def wants_colour(stream: TextIO) -> bool:
    """Colour on a terminal, unless NO_COLOR is set (https://no-color.org) or TERM is dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return is_tty(stream)


class Style:
    """Wraps text in ANSI codes when enabled, returns it unchanged otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


class Spinner:
    """One spinner line; `stop()` clears it at once, so that the next output starts on a clean line."""

    def __init__(self, stream: TextIO, label: str, delay: float) -> None:
        self.stream = stream
        self.label = label
        self.delay = delay
        self.done = anyio.Event()
        self.shown = False

    def stop(self) -> None:
        if self.done.is_set():
            return
        self.done.set()
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False

    async def run(self) -> None:
        start = time.monotonic()
        with anyio.move_on_after(self.delay):
            await self.done.wait()
        frame = 0
        while not self.done.is_set():
            sys.stdout.flush()  # what was printed so far goes first
            elapsed = time.monotonic() - start
            self.stream.write(f"\r{_FRAMES[frame % len(_FRAMES)]} {self.label} {elapsed:4.1f}s")
            self.stream.flush()
            self.shown = True
            frame += 1
            with anyio.move_on_after(0.1):
                await self.done.wait()


class Progress:
    """Spinners with elapsed seconds on a terminal stream (stderr by default); nothing on anything else."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_tty(self.stream) if enabled is None else enabled

    def start(self, tg: anyio.abc.TaskGroup, label: str, *, delay: float = 0.0) -> Callable[[], None]:
        """Spin in `tg` (after `delay` seconds) until the returned function is called."""
        spinner = Spinner(self.stream, label, delay)
        if self.enabled:
            tg.start_soon(spinner.run)
        return spinner.stop

    @asynccontextmanager
    async def show(self, label: str, *, delay: float = 0.0) -> AsyncIterator[Callable[[], None]]:
        """Spin while the block runs; the yielded function stops the spinner early (say, at the first token)."""
        if not self.enabled:
            yield lambda: None
            return
        async with anyio.create_task_group() as tg:
            stop = self.start(tg, label, delay=delay)
            try:
                yield stop
            finally:
                stop()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> list[str]:
    """Lines of a plain-text table; `align` has an "l" or "r" per column (default: first left, others right)."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.ljust(w) if a == "l" else v.rjust(w) for v, w, a in zip(values, widths, align, strict=True)]
        return "  ".join(parts).rstrip()

    return [line(list(headers)), line(["-" * w for w in widths]), *(line(r) for r in cells)]


def seconds(value: float) -> str:
    return f"{value:.1f}s" if value >= 0.1 else f"{value * 1000:.0f}ms"


def size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"
