"""A scripted slot backend for deterministic tests of everything above the slot (queue, policies,
cancellation, timeouts, close, commits) and for overhead benchmarks: no model, no sleeps.

`ScriptedBackend` renders a conversation to one token per character (`runtime.testing.chars`) of a plain
`role: content` text, or of what `template` renders (a chat template's `apply_template`, for tests that need a
real one), answers with `reply(messages)` (default: `"echo: <last message>"`), streams it a word at a time
(or as `pieces` cuts it), and keeps the last conversation's tokens as "the slot", so `cached_tokens` behaves
like a one-entry cache.
Its counters are `SlotStats`, as the real backend's (no cache tiers: those read 0); a real `DiskTier` may
be given (`disk=`) for tests of what reads the tier's stats while something writes to it.

A `Gate` holds a turn inside `run` (in the worker thread) until the test opens it, and tells the test
when the turn has arrived there:

    gate = backend.hold("a")             # the next turn of session "a" waits at the gate
    async with anyio.create_task_group() as tg:
        tg.start_soon(rt.chat, "a", "hi")
        await gate.arrived()             # "a" is running now, in the worker thread
        ...                              # queue more, cancel, time out, close: all deterministic
        gate.open()

A `Pause` (`backend.pause = Pause(after=2)`) holds generation after that many pieces until `go()`, so a
streaming test sees the first pieces before the rest exist.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.from_thread

from caches.disk.stats import DiskTierStats
from caches.disk.tier import DiskTier
from caches.tiered import Location
from caches.tokens import lcp
from runtime.backend.protocol import (
    WHOLE,
    EngineInfo,
    GrammarSpec,
    RenderedChat,
    RenderOptions,
    SlotRequest,
    SlotResult,
    SlotStats,
)
from runtime.errors import ContextOverflow, InvalidRequest
from runtime.reasoning import ReasoningFormat
from runtime.testing.chars import char_piece, char_tokens, computed_nothing
from runtime.tools import GenericFormat, ToolFormat
from runtime.types import CacheSource, FinishReason

__all__ = ["Gate", "Pause", "Render", "ScriptedBackend"]

Render = Callable[..., str]
"""A chat template's renderer: `(messages, *, tools, add_generation_prompt, chat_template_kwargs) -> text`."""


class Gate:
    """Holds one scripted turn in the worker thread until `open()`; `arrived()` waits until it is there.

    Make it on the event loop (it captures the loop to signal arrival). A held turn also ends when the
    request is cancelled (it then returns `finish_reason="cancelled"`, as the real slot does).
    """

    def __init__(self) -> None:
        self._open = threading.Event()
        self._arrived = anyio.Event()
        self._token = anyio.lowlevel.current_token()

    def open(self) -> None:
        self._open.set()

    async def arrived(self) -> None:
        await self._arrived.wait()

    def _wait(self, cancelled: Callable[[], bool]) -> bool:
        """Worker thread: signal arrival, wait until opened; False if the request was cancelled first."""
        anyio.from_thread.run_sync(self._arrived.set, token=self._token)
        while not self._open.wait(0.002):  # the gate or a cancellation, whichever comes first
            if cancelled():
                return False
        return True


class Pause:
    """Holds the scripted generation after `after` pieces until `go()` (a threading event: the worker waits)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.event = threading.Event()

    def go(self) -> None:
        self.event.set()


class _Counts:
    """What a `ScriptedBackend` counts as it runs (worker thread); `stats()` copies it into a `SlotStats`."""

    def __init__(self) -> None:
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated_tokens = 0


def _echo(messages: Sequence[dict[str, Any]]) -> str:
    return f"echo: {messages[-1].get('content', '')}" if messages else "echo:"


def _spaced(text: str) -> list[str]:
    """`text` cut before each space (an empty piece where two spaces meet or the text is empty)."""
    return [word if i == 0 else " " + word for i, word in enumerate(text.split(" "))]


def _line(m: Mapping[str, Any]) -> str:
    return f"{m['role']}: {m.get('content') or ''}\n"


class ScriptedBackend:
    """A `SlotBackend` without a model; replies come from `reply(messages)`, prompts from `template` if given."""

    def __init__(
        self,
        reply: Callable[[Sequence[dict[str, Any]]], str] = _echo,
        *,
        n_ctx: int = 1 << 20,
        reasoning: ReasoningFormat | None = None,
        disk: DiskTier | None = None,
        template: Render | None = None,
        pieces: Callable[[str], list[str]] | None = None,
    ) -> None:
        self.reply = reply
        self.template = template  # None: the plain `role: content` lines
        self.split = pieces if pieces is not None else _spaced  # how a reply is cut into streamed pieces
        self.pause: Pause | None = None
        self.reasoning = reasoning
        self.template_kwargs: dict[str, Any] | None = None
        self.n_ctx = n_ctx
        self.disk = disk  # only reported (`disk_stats`) and closed; the scripted slot stores nothing in it
        self.name = "scripted"
        self.tokens: list[int] = []
        self.closed = False
        self.runs: list[str] = []  # session ids in the order their turns ran
        self._gates: dict[str, list[Gate]] = {}
        self._prepared: Sequence[dict[str, Any]] = ()  # prepare and run are called back to back, one thread
        self._n = _Counts()

    def hold(self, session_id: str) -> Gate:
        """A gate that the next (not yet held) turn of `session_id` waits at."""
        gate = Gate()
        self._gates.setdefault(session_id, []).append(gate)
        return gate

    # --- SlotBackend ---------------------------------------------------------------------------------

    def tool_format(self) -> ToolFormat:
        return GenericFormat()

    def generation_prompt(self) -> str:
        return "assistant: "

    def apply_template(
        self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = WHOLE, add_generation_prompt: bool = True
    ) -> str:
        if self.template is not None:
            gen, kw = add_generation_prompt, options.template_kwargs
            return self.template(messages, tools=options.tools, add_generation_prompt=gen, chat_template_kwargs=kw)
        text = "".join(_line(m) for m in messages)
        return text + "assistant: " if add_generation_prompt else text

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return char_tokens(text)  # one token a character, as `prepare` counts them

    def token_piece(self, token: int) -> bytes:
        return char_piece(token)

    def reasoning_format(self) -> ReasoningFormat | None:
        """The format its scripted replies use (`reasoning=`; None by default)."""
        return self.reasoning

    def check_grammar(self, spec: GrammarSpec) -> None:
        if "root" not in spec.gbnf:
            raise InvalidRequest("the grammar has no root rule")

    def prepare(
        self, messages: Sequence[Mapping[str, Any]], session_id: str | None = None, options: RenderOptions = WHOLE
    ) -> RenderedChat:
        self._prepared = [dict(m) for m in messages]
        self.template_kwargs = options.template_kwargs  # what the last render was given (tests read it)
        if self.template is not None:  # a real template: no message spans (no checkpoints to place here)
            text = self.apply_template(messages, options)
            return RenderedChat(text=text, tokens=char_tokens(text), message_starts=[], roles=[])
        parts = [_line(m) for m in messages]
        starts = list(itertools.accumulate((len(p) for p in parts[:-1]), initial=0)) if parts else []
        text = "".join(parts) + "assistant: "
        roles = [str(m["role"]) for m in messages]
        return RenderedChat(text=text, tokens=char_tokens(text), message_starts=starts, roles=roles)

    def run(self, req: SlotRequest) -> SlotResult:
        prompt = list(req.prompt)
        if not prompt or len(prompt) >= self.n_ctx:
            raise ContextOverflow(len(prompt), self.n_ctx)
        self.runs.append(req.session_id)
        messages, self._prepared = self._prepared, ()
        gates = self._gates.get(req.session_id)
        gate = gates.pop(0) if gates else None
        cached = min(lcp(self.tokens, prompt), len(prompt) - 1)
        if req.on_start is not None:
            req.on_start(len(prompt), cached)
        finish: FinishReason = "stop"
        text = ""
        if gate is not None and not gate._wait(req.cancel):
            finish = "cancelled"
        else:
            pause, limit = self.pause, req.sampling.max_tokens
            for i, piece in enumerate(self.split(self.reply(messages))):
                if req.cancel():
                    finish = "cancelled"
                    break
                if limit is not None and i >= limit:
                    finish = "length"
                    break
                text += piece
                if req.on_piece is not None:
                    req.on_piece(piece)
                if pause is not None and i + 1 == pause.after:
                    pause.event.wait()
        generated = char_tokens(text)
        self.tokens = prompt + generated
        n = self._n
        n.requests += 1
        n.prompt_tokens += len(prompt)
        n.cached_tokens += cached
        n.generated_tokens += len(generated)
        source: CacheSource = "slot" if cached else "none"
        return computed_nothing(
            text, finish, tokens=generated, prompt_tokens=len(prompt), cached_tokens=cached, cache_source=source
        )

    def settle(self) -> None:
        pass  # nothing is held back

    def set_key_weights(self, weight: Callable[[str], int]) -> None:
        pass  # no cache tiers

    def state_key(self) -> int:
        return hash(tuple(self.tokens))

    def locate(self, key: int) -> Location:
        return "none"

    def stats(self) -> SlotStats:
        n = self._n
        return SlotStats(
            requests=n.requests,
            prompt_tokens=n.prompt_tokens,
            cached_tokens=n.cached_tokens,
            prefilled_tokens=n.prompt_tokens - n.cached_tokens,
            generated_tokens=n.generated_tokens,
            slot_tokens=len(self.tokens),
        )

    def disk_stats(self) -> DiskTierStats | None:
        return self.disk.stats() if self.disk is not None else None

    def engine_info(self) -> EngineInfo:
        return EngineInfo(model=self.name, n_ctx=self.n_ctx)

    def close(self) -> None:
        self.closed = True
        if self.disk is not None:
            self.disk.close()
