"""Incremental chat rendering: each session's rendered and tokenized prompt is kept, so that a new turn
renders and tokenizes only its new messages, and the result equals a full render of the whole list.

A chat template's output is a concatenation of per-message pieces whose text depends on little context: the
first turn (templates inject a default system prompt, or fold the system prompt into the first user
message) and the message's own turn. So new messages are rendered as
`render(ctx + new) - render(ctx[:-1])` with `ctx` = the first turn + the turn of the last known message up
to it, and tokenized from the start of that last known message (message boundaries sit at special tokens,
where tokenization restarts). Message starts (the slot's checkpoint boundaries) are found the way a full
render finds them, by the common prefix of the tokens of the chat up to each message, but only over the
new part.

Each kept state is checked against a full render (text, tokens, message starts) at its extensions until
one whose context left messages out (the first turns of a conversation); a template for which they differ is rendered in full from then on (`prompt.incremental_off`).
A render that breaks a stability assumption on the way (an earlier message's text changed) falls back to
a full render for that call. The cache is a bounded LRU over sessions, validated on every call by
comparing the message prefix (any change of the history invalidates what follows it).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from caches.tokens import lcp
from runtime.chat_template import ChatTemplate, RenderedChat
from sessions.log import get_logger

__all__ = ["MAX_SESSIONS", "PromptRenderer", "digest", "turn_bounds"]

log = get_logger(__name__)

MAX_SESSIONS = 128
"""Sessions whose rendered prompt is kept (a state holds 4 bytes per token plus the text)."""

Msg = Mapping[str, Any]
Tokenize = Callable[[str, bool], list[int]]  # (text, add_special) -> tokens


def digest(message: Msg) -> int:
    """A digest of one message (its every field), to compare histories without keeping them."""
    return hash(msgspec.msgpack.encode(message))


def turn_bounds(roles: Sequence[str]) -> tuple[int, list[int]]:
    """(end of the first turn, index of every user message); a turn starts at a user message."""
    users = [i for i, r in enumerate(roles) if r == "user"]
    return (users[1] if len(users) > 1 else len(roles)), users


@dataclass
class _State:
    """A rendered message list: where each message starts, and the text and tokens before the last one."""

    digests: list[int]
    roles: list[str]
    starts: list[int]  # token index where each message starts
    char_starts: list[int]  # text index where each message starts (-1: not a resume point)
    text: str  # the text before the last message
    tokens: array[int]  # the tokens before the last message
    verified: bool = False


@dataclass
class _Step:
    """One extension of a state by `new` messages, and the prompt it makes."""

    state: _State
    rendered: RenderedChat


class PromptRenderer:
    """Renders and tokenizes chats for the slot, keeping each session's result for its next turn."""

    def __init__(self, template: ChatTemplate, tokenize: Tokenize, *, max_sessions: int = MAX_SESSIONS) -> None:
        self.template = template
        self._tokenize = tokenize
        self.max_sessions = max_sessions
        self.incremental = True  # False once the template was found to differ from a full render
        self._states: OrderedDict[str, _State] = OrderedDict()
        self.full_renders = 0  # counters, for tests and benchmarks
        self.extensions = 0

    def forget(self, key: str) -> None:
        self._states.pop(key, None)

    def render(self, messages: Sequence[Msg], key: str | None = None, *, spans: bool = True) -> RenderedChat:
        """The chat rendered with the generation prompt and tokenized, with every message's start.

        Equal to `ChatTemplate.render(messages, spans=True)`; with `key`, the state is kept for the next call.
        `spans=False` lets a full render (only when the template cannot be rendered incrementally) skip the
        message starts, as `ChatTemplate.render` does.
        """
        msgs = list(messages)
        if not msgs or not self.incremental:
            if not spans:
                return self.template.render(msgs, spans=False)  # type: ignore[arg-type]
            return self._full(msgs, gen=True)[1]
        digests = [digest(m) for m in msgs]
        state = self._states.pop(key, None) if key is not None else None
        step = self._resume(state, msgs, digests) if state is not None else None
        if step is None:
            step = self._build(msgs, digests)
        if key is not None and step.state.digests and self.incremental:
            self._states[key] = step.state
            while len(self._states) > self.max_sessions:
                self._states.popitem(last=False)
        return step.rendered

    # --- full renders ------------------------------------------------------------------------------

    def _render(self, msgs: Sequence[Msg], gen: bool) -> str:
        return self.template.render_text(msgs, add_generation_prompt=gen)  # type: ignore[arg-type]

    def _full(self, msgs: list[Msg], *, gen: bool) -> tuple[_State | None, RenderedChat]:
        """A full render (what `ChatTemplate.render(spans=True)` computes) and, if possible, its state."""
        self.full_renders += 1
        roles = [str(m["role"]) for m in msgs]
        text = self._render(msgs, gen)
        tokens = self._tokenize(text, True)
        starts = [0] if msgs else []
        before, part = "", []
        for i in range(1, len(msgs)):
            before = self._render(msgs[:i], False)
            part = self._tokenize(before, True)
            starts.append(lcp(part, tokens))
        rendered = RenderedChat(text=text, tokens=tokens, message_starts=starts, roles=roles)
        if not msgs or not text.startswith(before) or starts[-1] != len(part):
            return None, rendered
        chars = [-1] * len(msgs)
        chars[-1] = len(before)
        state = _State(
            digests=[digest(m) for m in msgs],
            roles=roles,
            starts=starts,
            char_starts=chars,
            text=before,
            tokens=array("i", tokens[: starts[-1]]),
        )
        return state, rendered

    # --- incremental renders ---------------------------------------------------------------------------

    def _resume(self, state: _State, msgs: list[Msg], digests: list[int]) -> _Step | None:
        """Extend `state` (or an earlier resume point of it) to `msgs`; None when it cannot be resumed."""
        same = lcp(state.digests, digests)
        q = min(same, len(state.digests), len(msgs)) - 1
        while q >= 0 and state.char_starts[q] < 0:
            q -= 1
        if q < 0:
            return None
        if q < len(state.digests) - 1:  # an earlier resume point: cut the state back to it
            state = _State(
                digests=state.digests[: q + 1],
                roles=state.roles[: q + 1],
                starts=state.starts[: q + 1],
                char_starts=state.char_starts[: q + 1],
                text=state.text[: state.char_starts[q]],
                tokens=state.tokens[: state.starts[q]],
                verified=state.verified,
            )
        return self._advance(state, msgs, digests)

    def _build(self, msgs: list[Msg], digests: list[int]) -> _Step:
        """A state from nothing: the first turn in full, then the rest a turn at a time."""
        first_end, _ = turn_bounds([str(m["role"]) for m in msgs])
        if first_end >= len(msgs):
            state, rendered = self._full(msgs, gen=True)
            return _Step(state, rendered) if state is not None else _Step(_dead(), rendered)
        state, _ = self._full(msgs[:first_end], gen=False)
        if state is None:
            return _Step(_dead(), self._full(msgs, gen=True)[1])
        step = self._advance(state, msgs, digests)
        return step if step is not None else _Step(_dead(), self._full(msgs, gen=True)[1])

    def _advance(self, state: _State, msgs: list[Msg], digests: list[int]) -> _Step | None:
        """Extend a state whose messages are a prefix of `msgs`, a turn at a time, to all of `msgs`."""
        _, users = turn_bounds([str(m["role"]) for m in msgs])
        n = len(state.digests)
        if n == len(msgs):  # nothing new (a regenerate): resume at the last message, rendering it again
            return self._extend(state, msgs, digests, len(msgs), gen=True)
        while True:
            after = [u for u in users if u > n]
            nxt = after[1] if len(after) > 1 else len(msgs)  # a chunk: the rest of a turn and the next turn
            gen = nxt == len(msgs)
            step = self._extend(state, msgs, digests, nxt, gen=gen)
            if step is None:
                return None
            if gen:
                return step
            if not step.state.digests:
                return None
            state, n = step.state, nxt

    def _extend(self, state: _State, msgs: list[Msg], digests: list[int], end: int, *, gen: bool) -> _Step | None:
        """Render msgs[q+1:end] after the state's last message q (rendering q again); None if unstable."""
        q = len(state.digests) - 1
        roles = [str(m["role"]) for m in msgs[:end]]
        first_end, users = turn_bounds(roles)
        turn = max((u for u in users if u <= q), default=0)
        skips = turn > first_end  # the context leaves out messages: what the check must see once
        ctx = [*msgs[:first_end], *msgs[turn : q + 1]] if skips else msgs[: q + 1]
        new = msgs[q + 1 : end]
        c = len(ctx) - 1
        before = self._render(ctx[:c], False) if c > 0 else ""
        prefixes = [self._render(ctx + new[:j], False) for j in range(len(new))]  # text up to each new message
        final = self._render(ctx + new, gen)
        if not all(t.startswith(before) for t in prefixes) or not final.startswith(before):
            return None
        base_char, base_tok = state.char_starts[q], state.starts[q]
        special = base_tok == 0  # resuming at the first message: tokenize like a full render (BOS)
        cut = len(before)
        toks = self._tokenize(final[cut:], special)
        starts = state.starts[: q + 1]
        chars = state.char_starts[: q + 1]
        part: list[int] = []
        for t in prefixes:
            part = self._tokenize(t[cut:], special)
            starts.append(base_tok + lcp(part, toks))
            chars.append(base_char + len(t) - cut if final.startswith(t) and starts[-1] - base_tok == len(part) else -1)
        self.extensions += 1
        text = state.text[:base_char] + final[cut:]
        tokens = state.tokens[:base_tok]
        prompt = tokens.tolist() + toks
        rendered = RenderedChat(
            text=text, tokens=prompt, message_starts=starts, roles=[*state.roles[: q + 1], *roles[q + 1 :]]
        )
        last = starts[-1] if new else base_tok
        last_char = chars[-1] if new else base_char
        if last_char < 0:  # the last message is no resume point: keep no state (the next call renders in full)
            nxt = _dead()
        else:
            tokens.extend(toks[: last - base_tok])
            nxt = _State(
                digests=digests[:end],
                roles=rendered.roles,
                starts=starts,
                char_starts=chars,
                text=text[:last_char],
                tokens=tokens,
                verified=state.verified,
            )
        if not state.verified:
            _, full = self._full(msgs[:end], gen=gen)
            if (full.text, full.tokens, full.message_starts) != (rendered.text, rendered.tokens, starts):
                self.incremental = False
                self._states.clear()
                log.warning("prompt.incremental_off", messages=end, reason="differs from a full render")
                return _Step(_dead(), full)
            nxt.verified = skips
        return _Step(nxt, rendered)


def _dead() -> _State:
    """A state that resumes nothing (the next call renders in full)."""
    return _State(digests=[], roles=[], starts=[], char_starts=[], text="", tokens=array("i"))
