"""A scripted backend that speaks a real chat template: the Runtime's prompts are rendered by `apply_template`
with the vendored template (tools, tool calls and results included), one token per character, and the tool and
reasoning formats are the ones the Runtime works out for that template (tests/tool_reading.py). The scripted
reply is given the rendered prompt, so a script answers what the template really showed the model; a
`Pause` holds generation after some pieces until the test has seen them (streaming tests, no sleeps)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from caches.tokens import lcp
from runtime import Reply, ToolCallDelta
from runtime.backend.protocol import RenderedChat, SlotRequest, SlotResult
from runtime.reasoning import ReasoningFormat
from runtime.templates import apply_template
from runtime.testing import ScriptedBackend
from runtime.tools import ToolFormat
from tests.tool_reading import view

__all__ = ["Pause", "TemplateBackend", "collect", "of_reply", "parts"]

Script = Callable[[str], str]  # the rendered prompt -> the model's raw output


class Pause:
    """Holds the scripted generation after `after` pieces until `go()` (a threading event: the worker waits)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.event = threading.Event()

    def go(self) -> None:
        self.event.set()


class TemplateBackend(ScriptedBackend):
    """`ScriptedBackend` rendering with the vendored `template`; `script(prompt)` gives the raw output."""

    def __init__(
        self,
        template: str,
        script: Script,
        *,
        pieces: Callable[[str], list[str]] | None = None,
        tools: ToolFormat | None = None,
    ) -> None:
        super().__init__(lambda _messages: script(self.prompts[-1]))
        self.view = view(template)
        self.tools = tools if tools is not None else self.view.tools
        self.source = self.view.source
        self.name = template
        self.prompts: list[str] = []  # every prompt rendered for a run, in order
        self.split = pieces  # how the output is cut into pieces (default: at spaces, as ScriptedBackend)
        self.pause: Pause | None = None

    def tool_format(self) -> ToolFormat:
        return self.tools

    def reasoning_format(self) -> ReasoningFormat | None:
        return self.view.reasoning

    def generation_prompt(self) -> str:
        return ""  # no grammar is fed a prompt here

    def apply_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return apply_template(
            self.source,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
        )

    def prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        session_id: str | None = None,
        *,
        spans: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedChat:
        text = self.apply_template(messages, tools=tools, chat_template_kwargs=template_kwargs)
        self.prompts.append(text)
        self._prepared = [dict(m) for m in messages]
        self.template_kwargs = template_kwargs
        return RenderedChat(text=text, tokens=[ord(c) for c in text], message_starts=[], roles=[])

    def run(self, req: SlotRequest) -> SlotResult:
        """The script's output for the last prompt, handed on in pieces (`pieces`, default: word by word with
        the spaces kept), holding at the `pause`; stops when the request is cancelled or at max_tokens pieces."""
        prompt = list(req.prompt)
        self.runs.append(req.session_id)
        text = self.reply(self._prepared)
        parts = self.split(text) if self.split is not None else _words(text)
        pause, limit = self.pause, req.sampling.max_tokens
        out, finish = "", "stop"
        for i, part in enumerate(parts):
            if req.cancel():
                finish = "cancelled"
                break
            if limit is not None and i >= limit:
                finish = "length"
                break
            out += part
            if req.on_piece is not None:
                req.on_piece(part)
            if pause is not None and i + 1 == pause.after:
                pause.event.wait()
        cached = min(lcp(self.tokens, prompt), len(prompt) - 1)
        generated = [ord(c) for c in out]
        self.tokens = prompt + generated
        return SlotResult(
            text=out,
            finish_reason=finish,  # type: ignore[arg-type]
            tokens=generated,
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            prefilled_tokens=len(prompt) - cached,
            cache_source="slot" if cached else "none",
            bytes_saved=0,
            bytes_restored=0,
            t_cache=0.0,
            t_prefill=0.0,
            t_decode=0.0,
            t_first_token=None,
        )


def _words(text: str) -> list[str]:
    """`text` cut before each space (the pieces add up to it exactly)."""
    parts: list[str] = []
    for i, word in enumerate(text.split(" ")):
        parts.append(word if i == 0 else " " + word)
    return [p for p in parts if p]


def collect(items: list[Any]) -> tuple[str, list[dict[str, Any]], str, Reply]:
    """What a stream's pieces add up to: the answer text, the calls ({id, name, arguments} from the deltas,
    checked to be OpenAI-shaped: a first piece with id and name, then arguments text), the reasoning, and the
    Reply that ended it."""
    reply = items[-1]
    assert isinstance(reply, Reply)
    text = "".join(p for p in items[:-1] if type(p) is str)
    reasoning = "".join(p for p in items[:-1] if isinstance(p, str) and type(p) is not str)
    calls: list[dict[str, Any]] = []
    for p in items[:-1]:
        if isinstance(p, ToolCallDelta):
            if p.id:
                assert p.index == len(calls) and p.arguments_delta == ""
                calls.append({"id": p.id, "name": p.name, "arguments": ""})
            else:
                assert p.name == "" and p.index < len(calls)
                calls[p.index]["arguments"] += p.arguments_delta
    return text, calls, reasoning, reply


def parts(items: list[Any]) -> tuple[str, list[dict[str, Any]], Reply]:
    """`collect` without the reasoning."""
    text, calls, _, reply = collect(items)
    return text, calls, reply


def of_reply(reply: Reply) -> list[dict[str, Any]]:
    """A Reply's calls as the pieces give them ({id, name, arguments JSON text})."""
    return [
        {"id": c.id, "name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)} for c in reply.tool_calls
    ]
