"""Named normalizations of volatile prompt spans: text a client puts into the prompt that changes between
requests of one conversation without meaning anything to the model, and would end the cached prefix there.
Each is documented in docs/coding-agents.md; `turnstile serve --no-normalize` turns them all off, so the
model sees exactly the rendering of what the client sent.

- `billing-header` (Messages): Claude Code starts its system prompt with
  `x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=XXXXX;` where `cch` is a per-request
  integrity stamp. Its value is replaced by as many `f`s, as llama-server does (tools/server/server-chat.cpp,
  `normalize_anthropic_billing_header`, ggml-org/llama.cpp#21793): same length, no other change.
- `system-reminder` (Messages): Claude Code puts `<system-reminder>…</system-reminder>` blocks into user turns
  (text blocks and tool results): the session's context (CLAUDE.md, …) at the start of the first user message,
  and per-turn notes (the todo list, changed files, …) on the newest turn, which move to the next newest or
  vanish in the following request, so the prompt differs from the cached one inside an earlier turn. The
  reminders that open the first user message (before its first other text) are kept; every other one is
  removed, with the whitespace that follows it (at the end of a text: that precedes it); a later user turn
  left empty is left out. The model does not see the per-turn reminders.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["BILLING_PREFIX", "REMINDER", "billing_header", "system_reminders"]

BILLING_PREFIX = "x-anthropic-billing-header:"
_CCH = re.compile(r"cch=([0-9A-Za-z]+);")
REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)


def billing_header(text: str) -> str:
    """`text` with the `cch=` stamp of a leading billing header blanked (any other text unchanged)."""
    if not text.startswith(BILLING_PREFIX):
        return text
    m = _CCH.search(text, len(BILLING_PREFIX))
    if m is None:
        return text
    return text[: m.start(1)] + "f" * len(m.group(1)) + text[m.end(1) :]


def _without_reminders(text: str, *, keep_leading: bool) -> str:
    """`text` without its `<system-reminder>` blocks (`keep_leading`: those before any other text stay). A block
    goes with the whitespace after it, or, at the end of the text, with the whitespace before it."""
    start = 0
    if keep_leading:
        while (m := REMINDER.match(text, len(text) - len(text[start:].lstrip()))) is not None:
            start = m.end()
    segments = REMINDER.split(text[start:])
    if len(segments) == 1:
        return text
    out = segments[0]
    for seg in segments[1:]:
        out += seg.lstrip()
    if not segments[-1].strip():
        out = out.rstrip()
    return text[:start] + out


def system_reminders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shaped `messages` with the `system-reminder` normalization (module docstring): the blocks that open
    the first user message kept, every other one in a user or tool message removed (new dicts where changed), a
    later user message left empty left out."""
    out: list[dict[str, Any]] = []
    first = True
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role in ("user", "tool") and isinstance(content, str) and "<system-reminder>" in content:
            keep = first and role == "user"
            m = {**m, "content": _without_reminders(content, keep_leading=keep)}
            if role == "user" and not m["content"].strip() and not first:
                continue  # a user turn that held only reminders is left out
        if role == "user":
            first = False
        out.append(m)
    return out
