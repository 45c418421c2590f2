"""The context policy of a turn: which messages of the session make the prompt.

- "error" (the default): all of them; a history that does not fit the context fails the turn with
  `ContextOverflow` (raised by the slot before anything changes) and the session is not changed.
- "window": the system message plus the newest whole turns that fit, leaving room for the reply
  (`max_tokens`, or `RESERVE` tokens when it is None). When the kept turns stop fitting, the oldest are
  dropped in one step down to `KEEP` of the budget (`sessions.window.plan`), so the following turns extend a
  cached prefix again. The stored history keeps every message; `Reply.usage.dropped_messages` says how
  many the prompt left out and a `context.cut` event records each cut. A turn that does not fit even
  alone is `ContextOverflow`, with its size.

The plan needs each message's size in tokens: they come from the renders (`SlotBackend.prepare` gives
every message's start), measured once per message when it is new (so the cuts are a function of the
history) and kept per session in a bounded LRU. An entry is validated by comparing the system message and
the messages the last prompt kept; the dropped messages are not compared again (they only decide where
later cuts fall, never what a prompt holds: a prompt is rendered from the messages and checked against
the context).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.backend.protocol import RenderedChat, RenderOptions, SlotBackend
from runtime.errors import ContextOverflow
from runtime.log import get_logger
from runtime.types import MAX_SESSIONS
from sessions.model import CONTEXT_POLICIES, ContextPolicy
from sessions.window import KEEP, common_prefix, plan, turn_starts

__all__ = ["CONTEXT_POLICIES", "RESERVE", "ContextPolicy", "ContextWindow", "Prompt", "room_for"]

log = get_logger(__name__)

RESERVE = 512
"""Tokens a windowed prompt leaves for the reply when `max_tokens` is None (at most a quarter of n_ctx).
Generation still runs until the context is full ("length"), as with the "error" policy."""

Msg = Mapping[str, Any]


def room_for(n_ctx: int, max_tokens: int | None) -> int:
    """The tokens a windowed prompt leaves free for the reply."""
    if max_tokens is not None:
        return max_tokens
    return max(1, min(RESERVE, n_ctx // 4))


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt and how many messages of the conversation it leaves out."""

    rendered: RenderedChat
    dropped: int = 0


@dataclass
class _Sizes:
    head: list[Msg]  # the system message (if any)
    kept: list[Msg]  # the messages the last prompt kept, from `first` on
    sizes: list[int]  # tokens of each message; the last one's includes the generation prompt (provisional)
    first: int  # the first message after the system message that the last prompt kept


def _sizes(r: RenderedChat) -> list[int]:
    """Tokens of each message of a rendered chat (the last one up to the end, generation prompt included)."""
    ends = [*r.message_starts[1:], len(r.tokens)]
    return [e - s for s, e in zip(r.message_starts, ends, strict=True)]


class ContextWindow:
    """Chooses each turn's prompt by the context policy; keeps each session's message sizes."""

    def __init__(self, *, keep: float = KEEP, max_sessions: int = MAX_SESSIONS) -> None:
        self.keep = keep
        self.max_sessions = max_sessions
        self._entries: OrderedDict[str, _Sizes] = OrderedDict()

    def prepare(
        self,
        backend: SlotBackend,
        key: str | None,
        messages: Sequence[Msg],
        policy: ContextPolicy,
        max_tokens: int | None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Prompt:
        """The prompt for `messages` (the last one is the message to answer) under `policy`; `template_kwargs`
        are the template variables of the turn (a thinking model's switch and the caller's)."""
        if policy == "error":
            return Prompt(backend.prepare(messages, key, RenderOptions(spans=False, template_kwargs=template_kwargs)))
        msgs = list(messages)
        n_ctx = backend.n_ctx
        room = room_for(n_ctx, max_tokens)
        budget = n_ctx - room
        head = 1 if msgs and msgs[0]["role"] == "system" else 0
        entry = self._entries.pop(key, None) if key is not None else None
        known: list[int] = []
        first = head
        if entry is not None and entry.head == msgs[:head] and len(msgs) > entry.first:
            same = entry.first + common_prefix(entry.kept, msgs[entry.first :])
            k = min(same, len(entry.sizes) - 1, len(msgs) - 1)  # messages with final sizes (not the last)
            if entry.first <= k:
                known, first = entry.sizes[:k], entry.first
        rendered = backend.prepare([*msgs[:head], *msgs[first:]], key, RenderOptions(template_kwargs=template_kwargs))
        measured = _sizes(rendered)
        sizes = known + measured[head + len(known) - first :]
        starts = [head + s for s in turn_starts([str(m["role"]) for m in msgs[head:]])]
        turn_sizes = [sum(sizes[s:e]) for s, e in zip(starts, [*starts[1:], len(msgs)], strict=True)]
        fixed = sum(sizes[:head])
        window = plan(turn_sizes, fixed, budget, self.keep)
        if not window.fits:
            raise ContextOverflow(fixed + (turn_sizes[-1] if turn_sizes else 0), n_ctx, room)
        turn = window.first_turn
        kept = starts[turn] if starts else head
        while True:
            if kept != first:
                if kept > first:
                    log.info(
                        "context.cut",
                        dropped_messages=kept - head,
                        newly_dropped=kept - first,
                        kept_messages=len(msgs) - kept,
                        kept_tokens=fixed + sum(turn_sizes[turn:]),
                        budget=budget,
                    )
                rendered = backend.prepare(
                    [*msgs[:head], *msgs[kept:]], key, RenderOptions(template_kwargs=template_kwargs)
                )
                first = kept
            if len(rendered.tokens) + room <= n_ctx:
                break
            # the sizes under-estimated this prompt (a template that renders a first message differently)
            if turn + 1 >= len(starts):
                raise ContextOverflow(len(rendered.tokens), n_ctx, room)
            turn += 1
            kept = starts[turn]
            log.info("context.estimate_off", prompt=len(rendered.tokens), budget=budget)
        if key is not None:
            self._entries[key] = _Sizes(msgs[:head], msgs[kept:], sizes, kept)
            while len(self._entries) > self.max_sessions:
                self._entries.popitem(last=False)
        return Prompt(rendered, kept - head)
