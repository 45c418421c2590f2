"""A cross-talk check that tells rounding from a leak, per token (teacher forcing on a fresh context).

For one acknowledged reply: the prompt its turn was answered from (the conversation's own messages as the
client recorded them, rendered with turnstile's own chat template path, `Engine.render`) followed by the
reply's tokens is evaluated alone on a fresh context of the same model; at every reply position the margin
is the highest logit minus the logit of the token the server produced. A greedy reply computed from that
prompt has margin 0 at every position, up to rounding: under load the same prompt is evaluated in other
batch shapes (a state recomputed in one batch instead of token by token), which moves logits by a little
and flips greedy choices between near-ties (a margin of a few hundredths to tenths of a logit). A reply
computed from another conversation's state (the leak class of llama.cpp #27148) holds tokens this prompt
does not make likely: margins of several logits. Later positions see the recorded reply (teacher forcing),
so one near-tie flip does not cascade into the rest of the reply.

    checker = Checker(model_path, threads=1)
    margins = checker.margins(checker.prompt(messages, tools), reply_tokens)
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from caches.tokens import lcp
from runtime.config import EngineConfig
from runtime.llama.engine import Engine

__all__ = ["Checker", "Reply", "summary"]


@dataclass(frozen=True)
class Reply:
    """One acknowledged reply to check: the prompt's messages (as the server rendered them) and its tokens.

    `tokens`: the ids the server reported (logprobs' `id`); None when the dialect reports none (Messages):
    the text is then tokenized, which can split a word otherwise than generation did (reported apart)."""

    conversation: int
    turn: int
    kind: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    text: str
    tokens: list[int] | None


class Checker:
    """A fresh context of the server's model, evaluating one prompt + reply at a time."""

    def __init__(self, model: str | Path, *, threads: int = 1, n_ctx: int = 4096, n_batch: int = 2048) -> None:
        cfg = EngineConfig(n_ctx=n_ctx, n_batch=n_batch, n_threads=threads, n_threads_batch=threads)
        self.engine = Engine(model, cfg)
        self.n_vocab = self.engine.n_vocab
        self._held: list[int] = []  # the tokens in the context (a prefix of the last prompt + reply)

    def close(self) -> None:
        self.engine.close()

    def prompt(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt's tokens: the chat rendered with the model's template (as the server renders a turn)."""
        return list(self.engine.render(messages, spans=False, tools=tools).tokens)

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text, add_special=False, parse_special=False)

    def margins(self, prompt: Sequence[int], reply: Sequence[int], *, same_conversation: bool = False) -> list[float]:
        """For each reply token: max logit - its logit, with `prompt` + the reply before it in context (0: the
        greedy choice). The prompt is evaluated in n_batch chunks, then its last token and the reply in one
        batch with logits for every reply position. A fresh context, unless `same_conversation`: the previous
        call was an earlier turn of the same conversation, whose tokens in common with this prompt are kept
        (that conversation's own tokens: the check costs its new tokens, not its whole prompt, per turn)."""
        if not prompt or not reply:
            return []
        e = self.engine
        head = list(prompt[:-1])
        keep = min(lcp(self._held, head), len(head)) if same_conversation else 0
        if keep == 0 or not e.seq_rm(keep):
            e.clear()
            keep = 0
        self._held = []
        for at in range(keep, len(head), e.n_batch):
            e.decode(head[at : at + e.n_batch], at, logits_last=False)
        tail = [prompt[-1], *reply[:-1]]
        e.decode(tail, len(head), logits_all=True)
        self._held = head + tail
        out: list[float] = []
        for i, tok in enumerate(reply):
            ptr = llama_cpp.llama_get_logits_ith(e.ctx, i)
            logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
            top = float(logits.max())
            out.append(top - float(logits[tok]) if math.isfinite(top) else math.inf)
        return out


def summary(margins: Sequence[float]) -> dict[str, float]:
    """The margin distribution: percentiles 50/90/99/99.9 and the largest (0 for none)."""
    if not margins:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}
    a = np.asarray(margins, dtype=np.float64)
    qs = np.percentile(a, [50, 90, 99, 99.9])
    return {
        "p50": round(float(qs[0]), 4),
        "p90": round(float(qs[1]), 4),
        "p99": round(float(qs[2]), 4),
        "p99.9": round(float(qs[3]), 4),
        "max": round(float(a.max()), 4),
    }


def check(
    checker: Checker,
    replies: Sequence[Reply],
    delta: float,
    *,
    seconds: float = math.inf,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every reply's margins; a token with margin > `delta` is cross-talk, its conversation flagged.

    Replies with ids from the server and replies whose text had to be tokenized are summed apart (a
    re-tokenized word can be split otherwise than generated, which shows as a margin that is no leak). A
    turn that offered tools is left unchecked: the server constrains such a reply with its tool-call grammar
    (SmolLM2's generic JSON format), so the unconstrained argmax is not what it chose from (the later turns,
    whose prompts hold that reply, are checked). Replies are checked conversation by conversation, turn by
    turn (each conversation on a fresh context, its own earlier tokens kept between its turns), until
    `seconds` have passed (the rest counted as not reached)."""
    by_ids: list[float] = []
    by_text: list[float] = []
    flagged: dict[int, dict[str, Any]] = {}
    unchecked = over = reached = 0
    previous = None
    t0 = time.monotonic()
    for n, r in enumerate(sorted(replies, key=lambda r: (r.conversation, r.turn))):
        if time.monotonic() - t0 > seconds:
            break
        if progress is not None and n % 100 == 0:
            progress(f"checked {n} of {len(replies)} replies")
        reached += 1
        if r.tools:
            unchecked += 1
            continue
        tokens = r.tokens if r.tokens is not None else checker.tokenize(r.text)
        margins = checker.margins(
            checker.prompt(r.messages, r.tools), tokens, same_conversation=previous == r.conversation
        )
        previous = r.conversation
        (by_ids if r.tokens is not None else by_text).extend(margins)
        bad = [i for i, m in enumerate(margins) if m > delta]
        over += len(bad)
        if bad and r.conversation not in flagged:
            i = max(bad, key=lambda j: margins[j])
            flagged[r.conversation] = {
                "conversation": r.conversation,
                "kind": r.kind,
                "turn": r.turn,
                "position": i,
                "token": checker.engine.token_to_piece(tokens[i]).decode("utf-8", "replace"),
                "margin": round(margins[i], 3),
                "reply": r.text,
                "ids": r.tokens is not None,
            }
    every = by_ids + by_text
    return {
        "replies checked": reached - unchecked,
        "replies not reached (time bound)": len(replies) - reached,
        "replies unchecked (tools offered: grammar-constrained)": unchecked,
        "tokens checked": len(every),
        "tokens from ids / tokenized text": f"{len(by_ids)} / {len(by_text)}",
        "margin (ids)": summary(by_ids),
        "margin (tokenized text)": summary(by_text),
        "delta": delta,
        "tokens over delta": over,
        "conversations flagged": len(flagged),
        "flagged": list(flagged.values()),
    }
