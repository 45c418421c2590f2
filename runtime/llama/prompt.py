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

Each new state is checked against a full render (text, tokens, message starts) at its extensions until one
whose context left messages out (the first turns of a conversation, so the check is cheap); after that, the
first extension of each shape (the kinds of message left out of its context and in it: a tool call, a tool
result, reasoning) is checked once more against a full render's text and tokens, which catches templates that
number tool calls across the history (Kimi K2) or flag the first one (the R1 distills). A template for
which they differ is rendered in full from then on (`prompt.incremental_off`). The state resumes at the last
message whose start is stable: Qwen3-style templates render a trailing assistant message differently (its
reasoning, an empty think block) from the same message followed by a user's, so their states resume at the
assistant's reply rather than at the user message after it, and every turn stays a few small renders.
A render that breaks a stability assumption on the way (an earlier message's text changed) falls back to
a full render for that call. The cache is a bounded LRU over sessions (`session_id` keys), validated on
every call by comparing the message prefix: any change of the history invalidates what follows it. A state
keeps the messages of the prompt it rendered, so its size is bounded by the context.

Template variables (`tools`, `template_kwargs`: a thinking switch, a reasoning effort) are part of every render
of a call; a state remembers the variables it was rendered with (a canonical JSON key) and is resumed only by a
call with the same ones; a call with other variables rebuilds the state (a conversation whose variables stay the
same renders incrementally, one that changes them pays one full render per change).
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from caches.tokens import lcp
from runtime.backend.protocol import RenderedChat
from runtime.llama.chat_template import ChatTemplate
from runtime.log import get_logger
from runtime.types import MAX_SESSIONS
from sessions.window import common_prefix

__all__ = ["PromptRenderer"]

log = get_logger(__name__)

Msg = Mapping[str, Any]
Tokenize = Callable[[str, bool], list[int]]  # (text, add_special) -> tokens


def _variables_key(extra: Mapping[str, Any]) -> str:
    """One string per set of template variables (key order and None values do not matter)."""
    given = {k: v for k, v in extra.items() if v}
    return json.dumps(given, sort_keys=True, ensure_ascii=False, default=repr) if given else ""


def _kind(m: Msg) -> tuple[str, bool, bool]:
    return str(m["role"]), bool(m.get("tool_calls")), bool(m.get("reasoning_content"))


def _shape(msgs: Sequence[Msg], first_end: int, turn: int, end: int) -> tuple[frozenset[Any], frozenset[Any]]:
    """What an extension that leaves msgs[first_end:turn] out of its context looks like: the kinds of message
    it leaves out (templates that number tool calls across the history, or flag the first one, see them) and
    the kinds in its context. The first extension of each shape is checked against a full render."""
    return frozenset(_kind(m) for m in msgs[first_end:turn]), frozenset(_kind(m) for m in msgs[turn:end])


@dataclass
class _Chat:
    """The messages to render, with their roles and where their turns start (computed once per call)."""

    msgs: list[Msg]
    roles: list[str]
    users: list[int]
    extra: dict[str, Any]  # the template variables of every render (`tools`, `template_kwargs`)
    key: str  # their `_variables_key`

    def first_end(self, end: int) -> int:
        """Where the first turn of msgs[:end] ends (the second user message)."""
        return self.users[1] if len(self.users) > 1 and self.users[1] < end else end

    def turn_of(self, i: int) -> int:
        """The first message of the turn that message i belongs to."""
        k = bisect_right(self.users, i)
        return self.users[k - 1] if k else 0


@dataclass
class _State:
    """A rendered message list: where each message starts, and the text and tokens before the last one."""

    msgs: list[Msg]  # the messages (their number is bounded by the context the prompt fits in)
    roles: list[str]
    users: list[int]
    starts: list[int]  # token index where each message starts
    char_starts: list[int]  # text index where each message starts (-1: not a resume point)
    text: str  # the text before the last message
    tokens: list[int]  # the tokens before the last message
    verified: bool = False
    variables: str = ""  # the `_variables_key` of the template variables it was rendered with


@dataclass
class _Step:
    """One extension of a state by `new` messages, and the prompt it makes."""

    state: _State | None
    rendered: RenderedChat


class PromptRenderer:
    """Renders and tokenizes chats for the slot, keeping each session's result for its next turn."""

    def __init__(self, template: ChatTemplate, tokenize: Tokenize, *, max_sessions: int = MAX_SESSIONS) -> None:
        self.template = template
        self._tokenize = tokenize
        self.max_sessions = max_sessions
        self.incremental = True  # False once the template was found to differ from a full render
        self._states: OrderedDict[str, _State] = OrderedDict()
        self._shapes: set[tuple[Any, ...]] = set()  # kinds of extension checked against a full render
        self.full_renders = 0  # counters, for tests and benchmarks
        self.extensions = 0

    def forget(self, key: str) -> None:
        self._states.pop(key, None)

    def render(
        self,
        messages: Sequence[Msg],
        key: str | None = None,
        *,
        spans: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedChat:
        """The chat rendered with the generation prompt and tokenized, with every message's start.

        Equal to `ChatTemplate.render(messages, spans=True, tools=tools, template_kwargs=template_kwargs)`; with
        `key`, the state is kept for the next call (with the same variables). `spans=False` lets a full render
        (only when the template cannot be rendered incrementally) skip the message starts, as
        `ChatTemplate.render` does.
        """
        msgs = list(messages)
        extra: dict[str, Any] = {"tools": tools, "template_kwargs": template_kwargs}
        if not msgs or not self.incremental or (key is None and not spans):
            if not spans:
                return self.template.render(msgs, spans=False, **extra)  # type: ignore[arg-type]
            return self._full(msgs, extra, gen=True)[1]
        variables = _variables_key(extra)
        state = self._states.pop(key, None) if key is not None else None
        if state is not None and state.variables != variables:
            state = None  # rendered with other variables: every message may render differently
        same = common_prefix(state.msgs, msgs) if state is not None else 0
        if state is not None and same:
            roles = [*state.roles[:same], *(str(m["role"]) for m in msgs[same:])]
            users = state.users[: bisect_left(state.users, same)]
            users += [i for i in range(same, len(msgs)) if roles[i] == "user"]
        else:
            roles = [str(m["role"]) for m in msgs]
            users = [i for i, r in enumerate(roles) if r == "user"]
        chat = _Chat(msgs, roles, users, extra, variables)
        step = self._resume(state, chat, same) if state is not None else None
        if step is None:
            step = self._build(chat)
        if key is not None and step.state is not None and self.incremental:
            self._states[key] = step.state
            while len(self._states) > self.max_sessions:
                self._states.popitem(last=False)
        return step.rendered

    # --- full renders ------------------------------------------------------------------------------

    def _render(self, msgs: Sequence[Msg], gen: bool, extra: Mapping[str, Any]) -> str:
        return self.template.render_text(msgs, add_generation_prompt=gen, **extra)  # type: ignore[arg-type]

    def _full(self, msgs: list[Msg], extra: dict[str, Any], *, gen: bool) -> tuple[_State | None, RenderedChat]:
        """A full render (what `ChatTemplate.render(spans=True)` computes) and, if possible, its state."""
        self.full_renders += 1
        roles = [str(m["role"]) for m in msgs]
        text = self._render(msgs, gen, extra)
        tokens = self._tokenize(text, True)
        starts = [0] if msgs else []
        before, part = "", []
        for i in range(1, len(msgs)):
            before = self._render(msgs[:i], False, extra)
            part = self._tokenize(before, True)
            starts.append(lcp(part, tokens))
        rendered = RenderedChat(text=text, tokens=tokens, message_starts=starts, roles=roles)
        if not msgs or not text.startswith(before) or starts[-1] != len(part):
            return None, rendered
        chars = [-1] * len(msgs)
        chars[-1] = len(before)
        state = _State(
            msgs=list(msgs),
            roles=roles,
            users=[i for i, r in enumerate(roles) if r == "user"],
            starts=starts,
            char_starts=chars,
            text=before,
            tokens=tokens[: starts[-1]],
            variables=_variables_key(extra),
        )
        return state, rendered

    def _off(self, end: int, full: RenderedChat) -> _Step:
        """The template differs from a full render: render in full from now on."""
        self.incremental = False
        self._states.clear()
        self._shapes.clear()
        log.warning("prompt.incremental_off", messages=end, reason="differs from a full render")
        return _Step(None, full)

    # --- incremental renders ---------------------------------------------------------------------------

    def _resume(self, state: _State, chat: _Chat, same: int) -> _Step | None:
        """Extend `state` (or an earlier resume point of it) to the chat; None when it cannot be resumed."""
        q = min(same, len(state.msgs), len(chat.msgs)) - 1
        while q >= 0 and state.char_starts[q] < 0:
            q -= 1
        if q < 0:
            return None
        if q < len(state.msgs) - 1:  # an earlier resume point: cut the state back to it
            state = _State(
                msgs=state.msgs[: q + 1],
                roles=state.roles[: q + 1],
                users=state.users[: bisect_right(state.users, q)],
                starts=state.starts[: q + 1],
                char_starts=state.char_starts[: q + 1],
                text=state.text[: state.char_starts[q]],
                tokens=state.tokens[: state.starts[q]],
                verified=state.verified,
                variables=state.variables,
            )
        return self._advance(state, chat)

    def _build(self, chat: _Chat) -> _Step:
        """A state from nothing: the first turn in full, then the rest a turn at a time."""
        first_end = chat.first_end(len(chat.msgs))
        if first_end >= len(chat.msgs):
            state, rendered = self._full(chat.msgs, chat.extra, gen=True)
            return _Step(state, rendered)
        state, _ = self._full(chat.msgs[:first_end], chat.extra, gen=False)
        step = self._advance(state, chat) if state is not None else None
        return step if step is not None else _Step(None, self._full(chat.msgs, chat.extra, gen=True)[1])

    def _advance(self, state: _State, chat: _Chat) -> _Step | None:
        """Extend a state whose messages are a prefix of the chat's, a turn at a time, to all of them."""
        n, total = len(state.msgs), len(chat.msgs)
        if n == total:  # nothing new (a regenerate): resume at the last message, rendering it again
            return self._extend(state, chat, total, gen=True)
        while True:
            k = bisect_right(chat.users, n)
            nxt = chat.users[k + 1] if k + 1 < len(chat.users) else total  # the rest of a turn and the next
            gen = nxt == total
            step = self._extend(state, chat, nxt, gen=gen)
            if step is None or gen:
                return step
            if step.state is None or len(step.state.msgs) <= n:  # no resume point past the last one
                return None
            state, n = step.state, len(step.state.msgs)

    def _extend(self, state: _State, chat: _Chat, end: int, *, gen: bool) -> _Step | None:
        """Render msgs[q+1:end] after the state's last message q (rendering q again); None if unstable."""
        msgs = chat.msgs
        q = len(state.msgs) - 1
        first_end, turn = chat.first_end(end), chat.turn_of(q)
        skips = turn > first_end  # the context leaves out messages: what the check must see once
        ctx = [*msgs[:first_end], *msgs[turn : q + 1]] if skips else msgs[: q + 1]
        new = msgs[q + 1 : end]
        c = len(ctx) - 1
        extra = chat.extra
        before = self._render(ctx[:c], False, extra) if c > 0 else ""
        prefixes = [self._render(ctx + new[:j], False, extra) for j in range(len(new))]  # text up to each message
        final = self._render(ctx + new, gen, extra)
        if not all(t.startswith(before) for t in prefixes) or not final.startswith(before):
            return None
        base_char, base_tok = state.char_starts[q], state.starts[q]
        special = base_tok == 0  # resuming at the first message: tokenize like a full render (BOS)
        cut = len(before)
        toks = self._tokenize(final[cut:], special)
        starts = state.starts[: q + 1]
        chars = state.char_starts[: q + 1]
        for t in prefixes:
            part = self._tokenize(t[cut:], special)
            starts.append(base_tok + lcp(part, toks))
            clean = final.startswith(t) and starts[-1] - base_tok == len(part)
            chars.append(base_char + len(t) - cut if clean else -1)
        self.extensions += 1
        text = state.text[:base_char] + final[cut:]
        tokens = state.tokens[:base_tok]
        rendered = RenderedChat(text=text, tokens=tokens + toks, message_starts=starts, roles=chat.roles[:end])
        nxt: _State | None = None
        r = len(chars) - 1  # the state resumes at the last message whose start is a resume point
        while r > q and chars[r] < 0:
            r -= 1
        if chars[r] >= 0:  # (Qwen3-style templates: the user message after a trailing assistant is none)
            tokens.extend(toks[: starts[r] - base_tok])
            nxt = _State(
                msgs=msgs[: r + 1],
                roles=rendered.roles[: r + 1],
                users=chat.users[: bisect_right(chat.users, r)],
                starts=starts[: r + 1],
                char_starts=chars[: r + 1],
                text=text[: chars[r]],
                tokens=tokens,
                verified=state.verified,
                variables=chat.key,
            )
        shape = (chat.key, *_shape(msgs, first_end, turn, end)) if skips else None
        if not state.verified:
            _, full = self._full(msgs[:end], extra, gen=gen)
            if (full.text, full.tokens, full.message_starts) != (rendered.text, rendered.tokens, starts):
                return self._off(end, full)
            if nxt is not None:
                nxt.verified = skips
            if shape is not None:
                self._shapes.add(shape)
        elif shape is not None and shape not in self._shapes:  # a kind of extension not checked yet
            text = self._render(msgs[:end], gen, extra)
            if text != rendered.text or self._tokenize(text, True) != rendered.tokens:
                self.full_renders += 1
                return self._off(end, self._full(msgs[:end], extra, gen=gen)[1])
            self._shapes.add(shape)
        return _Step(nxt, rendered)
