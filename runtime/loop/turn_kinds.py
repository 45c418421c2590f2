"""What a caller asked for, one small frozen type per kind of turn (the runner dispatches on the type).

- `Chat`: a new user message; `ToolResults`: the results of the last reply's tool calls;
- `Regenerate`: a new reply to the same user message; `Edit`: user message `index` replaced, answered anew;
- `Complete`: a reply to a given message list (stateless, or committed as a named transcript);
- `CompletePrompt`: a raw prompt's tokens as given (no template, no split), never stored.

Every kind carries the turn's sampling `overrides`, where its `pieces` stream, and its `constraints`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from runtime.loop.constraints import Constraints
from runtime.loop.stream import Pieces
from runtime.types import RequestKind
from sessions import Session, history

__all__ = ["Chat", "Complete", "CompletePrompt", "Edit", "Regenerate", "ToolResults", "Turn", "pending"]


@dataclass(frozen=True, kw_only=True)
class _Turn:
    kind: ClassVar[RequestKind]
    creates: ClassVar[bool] = False
    """A committed turn of this kind creates its session on first use."""

    overrides: dict[str, Any]
    pieces: Pieces | None = None
    constraints: Constraints = field(default_factory=Constraints)

    @property
    def commit(self) -> bool:
        """Whether the reply is stored in the session (False: answer, store nothing)."""
        return True


@dataclass(frozen=True, kw_only=True)
class Chat(_Turn):
    kind = RequestKind.CHAT
    creates = True
    message: str


@dataclass(frozen=True, kw_only=True)
class ToolResults(_Turn):
    kind = RequestKind.CHAT
    creates = True
    results: dict[str, str]
    """By call id."""


@dataclass(frozen=True, kw_only=True)
class Regenerate(_Turn):
    kind = RequestKind.REGENERATE


@dataclass(frozen=True, kw_only=True)
class Edit(_Turn):
    kind = RequestKind.EDIT
    index: int
    message: str


@dataclass(frozen=True, kw_only=True)
class Complete(_Turn):
    kind = RequestKind.COMPLETE
    creates = True
    conversation: Session
    """The messages to answer, as a session."""
    stored: bool = True
    """False: a completion without a session id (answer, store nothing)."""

    @property
    def commit(self) -> bool:
        return self.stored


@dataclass(frozen=True, kw_only=True)
class CompletePrompt(_Turn):
    kind = RequestKind.COMPLETE
    prompt: tuple[int, ...]

    @property
    def commit(self) -> bool:
        return False


Turn = Chat | ToolResults | Regenerate | Edit | Complete | CompletePrompt


def pending(turn: Turn, session: Session, existed: bool) -> Session:
    """The session the turn's reply answers (and, committed, extends): chat, the history plus the new message or
    tool results; regenerate / edit, the session as it stands before the reply (ending with the user message to
    answer); complete, the caller's messages (a named transcript is replaced by them and the reply, keeping the
    session's identity and settings)."""
    match turn:
        case Chat():
            return history.append_user(session, turn.message)
        case ToolResults():
            return history.append_tool_results(session, turn.results)
        case Regenerate():
            return history.regenerate_base(session)
        case Edit():
            return history.edit(session, turn.index, turn.message)
        case Complete() if existed:
            return msgspec.structs.replace(
                turn.conversation,
                created=session.created,
                sampling=session.sampling,
                metadata=session.metadata,
                context=session.context,
            )
        case Complete():
            return turn.conversation
        case CompletePrompt():
            return session  # a new one, never stored


def new_chars(turn: Turn) -> int:
    """Characters of what is new in a turn: a chat turn's message or tool results; a completion's messages after
    its last assistant message (those before are usually cached); none for the others."""
    match turn:
        case Chat():
            return len(turn.message)
        case ToolResults():
            return sum(len(r) for r in turn.results.values())
        case Edit():
            return len(turn.message)
        case Complete():
            msgs = turn.conversation.messages
            last = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
            chars = sum(len(m.content) for m in msgs[last + 1 :])
            return chars + (len(turn.conversation.system or "") if last < 0 else 0)
        case CompletePrompt():
            return 0
        case Regenerate():
            return 0
