"""The reasoning budget: after N tokens inside the block, the closer (with an optional message) is forced.

llama-server's reasoning-budget sampler (common/reasoning-budget.cpp), on tokens: IDLE until the opener's
tokens are generated (or COUNTING from the start when the generation prompt opened the block), COUNTING
down the budget while watching for a natural closer, WAITING_UTF8 when the budget runs out inside a
character, FORCING the forced tokens one by one (the message, then the closer), DONE; a new opener in DONE
re-arms it with a fresh budget. A budget of 0 forces the closer at once (`reasoning="off"` on a template
that opens the block whatever its variables say). With a lazy grammar (tools) the machine runs with no
limit, to keep the grammar out of the block (`in_block`).

`BudgetSpec` is what a request carries (texts; the slot tokenizes them), `Budget` the state machine the
slot runs per request (tokens; no llama.cpp here, so it is tested on plain ints).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Budget", "BudgetSpec", "BudgetState", "utf8_complete"]


@dataclass(frozen=True)
class BudgetSpec:
    """One request's budget: `tokens` inside the block, then `message` + `end` are forced."""

    start: str
    end: str
    tokens: int
    message: str = ""
    inside: bool = False  # the generation prompt opened the block: counting starts at once

    @property
    def forced(self) -> str:
        return self.message + self.end


class BudgetState(enum.Enum):
    IDLE = "idle"
    COUNTING = "counting"
    WAITING_UTF8 = "waiting_utf8"
    FORCING = "forcing"
    DONE = "done"


class _Matcher:
    """Whether the text generated so far ends with `seq` (reset after a match). llama-server matches token
    sequences; matching the pieces' text also catches a tag spelled in several tokens (a grammar may spell it so)."""

    def __init__(self, seq: str) -> None:
        self.seq = seq
        self._recent = ""

    def advance(self, piece: str) -> bool:
        if not self.seq:
            return False
        self._recent = (self._recent + piece)[-len(self.seq) :]
        if self._recent == self.seq:
            self._recent = ""
            return True
        return False

    def reset(self) -> None:
        self._recent = ""


class Budget:
    """The budget's state machine over generated tokens: ask `forced()` before sampling, `accept` after (each
    token's text; `forced` are the tokens of message + closer)."""

    def __init__(self, start: str, end: str, forced: Sequence[int], budget: int, *, inside: bool = False) -> None:
        self._start = _Matcher(start)
        self._end = _Matcher(end)
        self._forced = list(forced)
        self.budget = budget
        self.remaining = budget
        self._pos = 0
        self.state = BudgetState.COUNTING if inside else BudgetState.IDLE
        if inside and budget <= 0:
            self.state = BudgetState.FORCING

    @property
    def in_block(self) -> bool:
        """Inside the reasoning block: a lazy grammar (tool calls) neither applies nor sees these tokens, so a
        trigger inside the reasoning is ignored (llama-server's `grammar_should_apply`)."""
        return self.state in (BudgetState.COUNTING, BudgetState.WAITING_UTF8, BudgetState.FORCING)

    def forced(self) -> int | None:
        """The token the next step must produce, or None to sample freely."""
        if self.state is BudgetState.FORCING and self._pos < len(self._forced):
            return self._forced[self._pos]
        return None

    def accept(self, piece: str, complete: bool = True) -> None:
        """A generated token's text; `complete`: its bytes end on a character boundary (UTF-8)."""
        st = self.state
        if st is BudgetState.IDLE or st is BudgetState.DONE:
            if self._start.advance(piece):
                self._arm()
        elif st is BudgetState.COUNTING or st is BudgetState.WAITING_UTF8:
            if self._end.advance(piece):
                self.state = BudgetState.DONE
            elif st is BudgetState.WAITING_UTF8:
                if complete:
                    self._force()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._force()
                    else:
                        self.state = BudgetState.WAITING_UTF8
                        self._end.reset()
        else:  # FORCING
            self._pos += 1
            if self._pos >= len(self._forced):
                self.state = BudgetState.DONE

    def _arm(self) -> None:
        self.remaining = self.budget
        self._end.reset()
        self.state = BudgetState.COUNTING
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self._end.reset()
        self._pos = 0
        self.state = BudgetState.FORCING if self._forced else BudgetState.DONE


def utf8_complete(piece: bytes) -> bool:
    """Whether a token's bytes end on a character boundary (llama.cpp's common_utf8_is_complete)."""
    n = len(piece)
    for back in range(1, min(4, n) + 1):
        b = piece[n - back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII): how long is its sequence?
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return back >= need
    return n == 0 or n > 4
