"""A small app to test: a help desk that sorts support tickets and drafts answers with a local model.

`Desk` takes anything with turnstile's `chat` (a `Runtime`, or the `turnstile` fixture's client in its
tests): `sort` asks for a structured `Triage` (the reply is constrained to its JSON schema), `draft` answers
the customer in the ticket's own session, so a follow-up sees what was said before.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec


class Triage(msgspec.Struct):
    category: Literal["bug", "question", "billing"]
    urgent: bool


class Chat(Protocol):
    async def chat(self, session_id: str, message: str | None = None, **options: Any) -> Any: ...


class Desk:
    def __init__(self, rt: Chat, max_tokens: int = 48) -> None:
        self.rt = rt
        self.max_tokens = max_tokens

    async def sort(self, ticket: str, text: str) -> Triage:
        prompt = f"Sort this support ticket. Ticket: {text}"
        reply = await self.rt.chat(f"sort-{ticket}", prompt, response_format=Triage, max_tokens=self.max_tokens)
        if reply.parsed is None:  # cut by max_tokens: count it as an urgent question for a human
            return Triage(category="question", urgent=True)
        parsed: Triage = reply.parsed
        return parsed

    async def draft(self, ticket: str, text: str) -> str:
        reply = await self.rt.chat(f"draft-{ticket}", text, max_tokens=self.max_tokens // 2)
        return str(reply.text).strip()
