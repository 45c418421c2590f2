"""The slot's decode loop: sample, detokenize, stop; with n-gram speculation, several tokens per step.

One step evaluates the pending token (sampled, not yet in memory) and, when the conversation's n-gram
index proposes a continuation, the drafted tokens after it, in one batch with logits at every position.
The draft is verified by sampling at each drafted position in turn: drafted token i is accepted while it
is what the sampler returns there; the first token that differs is kept as the next pending token and the
rest of the draft leaves the memory (`seq_rm`). With greedy sampling that is "accept while argmax"; with
sampling it is exact: the token is drawn from the same distribution p with the same random draw as without
speculation, and accepting a drafted x when the draw equals x accepts it with probability p(x), the draw
on a rejection being distributed as p without x, renormalised. Penalties and grammars see exactly the
accepted tokens (the sampler accepts what it returns); a drafted token the grammar rejects is never
returned, so it ends the draft.

Invariants, as for one-token decoding: `tokens` equals what the sequence's memory holds after every step
and at every return (the finishing token, and every rejected draft token, are not in memory); each
emitted token is preceded by a cancel check, so a cancel stops exactly where one-token decoding stops; a
draft never goes beyond `max_tokens`, the context or n_batch; each accepted token is streamed as it is
accepted. Speculation is only for memories that can drop a suffix (a transformer KV cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.backend.protocol import SlotRequest
from runtime.llama.engine import Engine
from runtime.llama.sampler import Sampler
from runtime.reasoning import Budget, utf8_complete
from runtime.reply import ProbText, TokenProb
from runtime.slot.detok import IncrementalText
from runtime.slot.ngram import Drafter
from runtime.slot.stops import StopMatcher
from runtime.types import FinishReason
from sessions import Sampling

__all__ = ["Decoded", "Generation", "budget_for", "preserved_tokens"]


@dataclass
class Decoded:
    """What a decode loop generated, how it ended and what speculation did in it."""

    finish: FinishReason
    t_first: float | None
    tokens: list[int] = field(default_factory=list)  # every emitted token
    probs: list[TokenProb] = field(default_factory=list)  # each token's probabilities (`Sampling.n_probs` > 0)
    text: str = ""  # the reply's text, cut at a stop string
    stopped_by: str | None = None  # the stop string that ended it
    draft_n: int = 0  # tokens drafted (llama-server's draft_n)
    draft_n_accepted: int = 0
    steps: int = 0  # decode batches run


class Generation:
    """One reply's decode loop as an object, so that it can stop after a token and go on later exactly.

    `run` decodes until the reply ends (it returns the `Decoded`, and the sampler is freed) or, when its `pause`
    check says so after a token was emitted, stops before that token is evaluated: it returns None, and the slot
    then holds `held` (the prompt and the tokens that entered memory), a state like any other. A later `run`
    (the slot's memory equal to `held` again) evaluates the pending token in the same one-token step an unpaused
    loop runs, with the same sampler (its random state, penalties and grammar), detokenizer, stop matcher and
    budget, so the reply's tokens and text are those of an unpaused one. `close` frees a paused one's sampler.

    The loop runs after the prompt until EOS, a stop string, `max_tokens`, the context's end or a cancel.
    `tokens` is the slot's token list (equal to memory; the prompt's last token's logits are current) and grows
    as tokens enter memory; the result holds every emitted token and the text; `on_token(t)` is called for each
    token that enters memory (the n-gram index follows the slot's tokens that way). `budget`: a reasoning
    budget that forces its closer when spent (no drafter then); `preserved`: special tokens detokenized as text.
    """

    def __init__(
        self,
        eng: Engine,
        tokens: list[int],
        req: SlotRequest,
        t0: float,
        drafter: Drafter | None = None,
        on_token: Callable[[int], None] | None = None,
        *,
        budget: Budget | None = None,
        preserved: frozenset[int] = frozenset(),
    ) -> None:
        self.eng, self.t0, self.drafter, self.on_token = eng, t0, drafter, on_token
        self.budget, self.preserved = budget, preserved
        self.max_tokens = req.sampling.max_tokens
        self.detok = IncrementalText()
        self.stops = StopMatcher(req.sampling.stop)
        self.out = Decoded("stop", None)
        self.lazy = req.grammar is not None and req.grammar.lazy
        self.pending: int | None = None  # sampled and emitted, not yet in memory (a paused loop's next step)
        self.held: list[int] = []  # what memory holds while paused
        s = req.sampling
        self.sampler: Sampler | None = eng.sampler(s, req.grammar)
        seen = prompt_window(s, len(tokens))
        if seen:  # llama-server feeds the prompt to the sampler first: penalties and DRY see its last tokens
            for t in tokens[-seen:]:
                self.sampler.accept(t)

    @property
    def paused(self) -> bool:
        return self.pending is not None

    def close(self) -> None:
        """Free the sampler (a paused generation that will not run again)."""
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None

    def run(self, tokens: list[int], req: SlotRequest, pause: Callable[[int], bool] | None = None) -> Decoded | None:
        """Decode on (from the start, or from where it paused: `tokens` then equals `held`); `req` gives this
        run's callbacks (`on_piece`, `cancel`); `pause(generated)` is asked after each emitted token."""
        try:
            out = self._run(tokens, req, pause)
        except BaseException:
            self.close()
            raise
        if out is not None:
            self.close()
        return out

    def _run(self, tokens: list[int], req: SlotRequest, pause: Callable[[int], bool] | None) -> Decoded | None:
        eng, drafter, budget, max_tokens = self.eng, self.drafter, self.budget, self.max_tokens
        detok, stops, out, preserved = self.detok, self.stops, self.out, self.preserved
        sampler = self.sampler
        assert sampler is not None, "a generation runs once to its end"
        generated = out.tokens

        n_probs = req.sampling.n_probs

        def emit(tok: int, idx: int = -1) -> FinishReason | None:
            """Hand on token `tok`, sampled at output `idx` (its logits still current: its probabilities are read)."""
            probs = sampler.probs(idx, tok, n_probs, special=preserved) if n_probs else None
            generated.append(tok)
            if out.t_first is None:
                out.t_first = time.perf_counter() - self.t0
            eog = eng.is_eog(tok)
            raw = eng.token_to_piece(tok, special=tok in preserved)
            if budget is not None:
                budget.accept(raw.decode("utf-8", "ignore"), utf8_complete(raw))
            piece = "" if eog else detok.feed(raw)
            text = stops.feed(piece, final=eog)
            finish: FinishReason | None = None
            if stops.stopped_by is not None or eog:
                finish = "stop"
            elif len(tokens) + 1 >= eng.n_ctx or (max_tokens is not None and len(generated) >= max_tokens):
                finish = "length"
                text += stops.feed(detok.flush(), final=True)
            if probs is not None and not detok.pending:  # llama-server leaves out a token ending inside a character
                entry = TokenProb(tok, text, raw, probs[0], tuple(probs[1]))
                out.probs.append(entry)
                if req.on_piece is not None:
                    req.on_piece(ProbText(text, (entry,)))  # one piece per token, as llama-server streams them
            elif text and req.on_piece is not None:
                req.on_piece(text)
            return finish

        def enter(tok: int) -> None:
            tokens.append(tok)
            if self.on_token is not None:
                self.on_token(tok)

        def done(finish: FinishReason) -> Decoded:
            out.finish, out.text, out.stopped_by = finish, stops.text, stops.stopped_by
            if drafter is not None:
                eng.seq_rm(len(tokens), -1)  # drop what memory holds beyond `tokens` (a draft's unaccepted rest)
                out.draft_n, out.draft_n_accepted = drafter.drafted, drafter.accepted
            return out

        def verify(draft: list[int]) -> tuple[int, int | None, FinishReason | None]:
            """(accepted, the next pending token if a drafted one was refused, a finish reason)."""
            for i, d in enumerate(draft):
                if req.cancel():
                    return i, None, "cancelled"
                t = sampler.sample(i)  # the logits of batch position i predict drafted token i
                if t != d:
                    return i, t, None
                finish = emit(d, i)
                if finish is not None:
                    return i + 1, None, finish
                enter(d)
            return len(draft), None, None

        def pick(idx: int = -1) -> int:
            """The next token: forced by the budget, or sampled (a lazy grammar stays out of the reasoning block)."""
            forced = budget.forced() if budget is not None else None
            if forced is not None:
                return sampler.force(forced)
            return sampler.sample(idx, grammar=not (self.lazy and budget is not None and budget.in_block))

        if req.cancel():
            return done("cancelled")
        resumed = self.pending
        if resumed is not None:
            tok, self.pending, self.held = resumed, None, []
        else:
            tok = pick()
        at = -1  # the output whose logits gave `tok` (a paused token was emitted before the pause)
        while True:
            if resumed is None:
                finish = emit(tok, at)
                if finish is not None:
                    return done(finish)
                if pause is not None and pause(len(generated)):
                    self.pending, self.held = tok, list(tokens)  # memory holds `tokens`; `tok` is the next step
                    return None
            resumed = None
            draft: list[int] = []
            if drafter is not None:
                room = min(eng.n_ctx - len(tokens) - 2, eng.n_batch - 1)
                if max_tokens is not None:
                    room = min(room, max_tokens - len(generated) - 1)
                draft = drafter.draft(tok, room)
            eng.decode([tok, *draft], len(tokens), logits_all=bool(draft))
            out.steps += 1
            enter(tok)
            at = len(draft) if draft else -1
            nxt: int | None = None
            if drafter is not None and draft:
                accepted, nxt, finish = verify(draft)
                drafter.accepted_n(len(draft), accepted)
                if finish is not None:
                    return done(finish)
                if accepted < len(draft):
                    eng.seq_rm(len(tokens), -1)
                    at = accepted  # the refused draft token's position gave the next token
            if nxt is None:
                if req.cancel():
                    return done("cancelled")
                nxt = pick(at)
            tok = nxt


def budget_for(eng: Engine, req: SlotRequest) -> Budget | None:
    """The request's reasoning budget on this vocabulary's tokens (llama-server's reasoning-budget sampler)."""
    spec = req.budget
    if spec is None:
        return None
    forced = eng.tokenize(spec.forced, add_special=False, parse_special=True)
    return Budget(spec.start, spec.end, forced, spec.tokens, inside=spec.inside)


def preserved_tokens(eng: Engine, req: SlotRequest) -> frozenset[int]:
    """The special tokens to detokenize as text: the request's tags that are one token each (as llama-server
    renders its `preserved_tokens`)."""
    out: set[int] = set()
    for text in req.preserved:
        toks = eng.tokenize(text, add_special=False, parse_special=True)
        if len(toks) == 1:
            out.add(toks[0])
    return frozenset(out)


def prompt_window(s: Sampling, n_prompt: int) -> int:
    """How many of the prompt's last tokens the sampler must see before decoding: the penalties' window and
    DRY's (0: neither is on, the prompt changes nothing; -1: the whole prompt)."""
    windows = [0]
    if s.repeat_penalty != 1.0 or s.presence_penalty or s.frequency_penalty:
        windows.append(n_prompt if s.repeat_last_n < 0 else s.repeat_last_n)
    if s.dry_multiplier != 0 and s.mirostat == 0:
        windows.append(s.dry_penalty_last_n)
    return min(max(windows), n_prompt)
