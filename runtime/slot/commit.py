"""Committing a reply's last sampled token into the slot (turnstile's rules), after the reply has gone out.

A decode loop ends on a token it sampled but never evaluated (the end-of-generation token, or the last
token at `max_tokens`): llama-server leaves it out of memory, so the conversation's next prompt, which
holds that token again, recomputes it, and a chained turn reuses the previous turn's total minus one.
Under `cache_rules="turnstile"` the slot holds that token back (`LastToken.hold`, at the end of a run)
and evaluates it later (`LastToken.settle`): when the worker has nothing else to do after the reply was
delivered, and at the latest before anything reads or saves the slot's state (the next run, a flush).
So the reply's latency never includes it, and the state a cache tier keeps ends where the next prompt
goes on.

Which token is held (the only ones the next prompt holds at that position):
- an end-of-generation token that the chat template writes right after an assistant message's content
  (`closers`: ChatML's `<|im_end|>`; a template that writes `" </s>"` after the content gets nothing);
- the last token of a reply cut at `max_tokens` (its text is the end of the stored reply), if the context
  has room for it;
- nothing when a stop string ended the reply (its tokens are trimmed from the history), when it was
  cancelled, or when the context is full.

Invariant: the slot's token list equals what its memory holds at all times. A held token is not in
either until `settle` evaluates it and appends it; `settle` evaluates it only if the token list is still
the one it was held for, and a failed evaluation leaves memory as it was (or asks for a reset where the
memory cannot drop a half-written token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from runtime.errors import LlamaDecodeError
from runtime.llama.engine import Engine
from runtime.log import get_logger
from runtime.types import FinishReason

__all__ = ["LastToken", "closers"]

log = get_logger(__name__)

_PROBE = "turnstile probe reply"  # an assistant's content, to see what the template writes after it


def closers(eng: Engine) -> frozenset[int]:
    """The end-of-generation tokens the chat template writes right after an assistant message's content when
    a user message follows (the next prompt's shape); empty if it writes something else first, or fails."""
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _PROBE},
        {"role": "user", "content": "hi"},
    ]
    try:
        text = eng.template.render_text(msgs, add_generation_prompt=False)
    except Exception as e:  # a template that refuses the probe: commit nothing
        log.info("commit.no_closer", reason=f"{type(e).__name__}: {e}")
        return frozenset()
    at = text.rfind(_PROBE)
    if at < 0:
        return frozenset()
    after = eng.tokenize(text[at + len(_PROBE) :], add_special=False, parse_special=True)
    return frozenset(after[:1]) if after and eng.is_eog(after[0]) else frozenset()


@dataclass
class _Held:
    token: int
    pos: int  # the length of the token list it follows


class LastToken:
    """The reply's last sampled token, held until the slot evaluates it (`settle`). `on`: turnstile's rules."""

    def __init__(self, eng: Engine, *, on: bool) -> None:
        self.eng = eng
        self.on = on
        self._closers: frozenset[int] | None = None  # worked out at the first end-of-generation
        self._held: _Held | None = None
        self.committed = 0  # tokens evaluated this way (a counter for tests and logs)

    def hold(self, tokens: list[int], generated: list[int], finish: FinishReason, stopped_by: str | None) -> int | None:
        """After a run: hold its last sampled token if the next prompt holds it after `tokens`; returns it."""
        self._held = None
        if not self.on or not generated or len(tokens) + 1 >= self.eng.n_ctx:
            return None
        tok = generated[-1]
        if finish == "length":
            keep = not self.eng.is_eog(tok)
        elif finish == "stop" and stopped_by is None and self.eng.is_eog(tok):
            if self._closers is None:
                self._closers = closers(self.eng)
            keep = tok in self._closers
        else:
            keep = False
        if keep:
            self._held = _Held(tok, len(tokens))
        return tok if keep else None

    def drop(self) -> None:
        """Forget the held token (the slot's memory was replaced or cleared)."""
        self._held = None

    def tokens(self, tokens: list[int]) -> list[int]:
        """What the token list will be once settled (the key a cache tier will save it under)."""
        held = self._held
        return [*tokens, held.token] if held is not None and held.pos == len(tokens) else tokens

    def settle(self, tokens: list[int]) -> bool:
        """Evaluate the held token at the end of `tokens` and append it; False if memory must be reset
        (a recurrent state half-written by a failed decode)."""
        held = self._held
        if held is None or held.pos != len(tokens):
            self._held = None
            return True
        eng = self.eng
        t0 = time.perf_counter()
        try:
            eng.decode([held.token], held.pos, logits_last=False)
        except LlamaDecodeError as e:
            self._held = None
            log.warning("commit.failed", code=e.code, pos=held.pos)
            return eng.can_truncate and eng.seq_rm(held.pos, -1)
        tokens.append(held.token)
        self._held = None  # after the append: `tokens()`, read from another thread, never misses the token
        self.committed += 1
        log.debug("commit.done", token=held.token, pos=held.pos, seconds=round(time.perf_counter() - t0, 4))
        return True
