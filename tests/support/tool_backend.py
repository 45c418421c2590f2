"""A scripted backend that speaks a real chat template: the Runtime's prompts are rendered by `apply_template`
with the vendored template (tools, tool calls and results included), one token per character, and the tool and
reasoning formats are the ones the Runtime works out for that template (tests/support/tool_reading.py). The scripted
reply is given the rendered prompt, so a script answers what the template really showed the model; a
`Pause` holds generation after some pieces until the test has seen them (streaming tests, no sleeps)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from runtime import Reply, ToolCallDelta
from runtime.backend.protocol import RenderedChat
from runtime.reasoning import ReasoningFormat
from runtime.templates import apply_template
from runtime.testing import ScriptedBackend
from runtime.testing.scripted import Pause
from runtime.tools import ToolFormat
from tests.support.tool_reading import view

__all__ = ["Pause", "TemplateBackend", "collect", "of_reply", "parts"]

Script = Callable[[str], str]  # the rendered prompt -> the model's raw output


class TemplateBackend(ScriptedBackend):
    """`ScriptedBackend` rendering with the vendored `template`; `script(prompt)` gives the raw output, handed on
    in pieces (`pieces`, default: word by word with the spaces kept, no empty pieces), holding at the `pause`."""

    def __init__(
        self,
        template: str,
        script: Script,
        *,
        pieces: Callable[[str], list[str]] | None = None,
        tools: ToolFormat | None = None,
    ) -> None:
        seen = view(template)
        super().__init__(
            lambda _messages: script(self.prompts[-1]),
            template=functools.partial(apply_template, seen.source),
            pieces=pieces if pieces is not None else _words,
        )
        self.view = seen
        self.tools = tools if tools is not None else seen.tools
        self.source = seen.source
        self.name = template
        self.prompts: list[str] = []  # every prompt rendered for a run, in order

    def tool_format(self) -> ToolFormat:
        return self.tools

    def reasoning_format(self) -> ReasoningFormat | None:
        return self.view.reasoning

    def generation_prompt(self) -> str:
        return ""  # no grammar is fed a prompt here

    def prepare(self, *args: Any, **kw: Any) -> RenderedChat:
        rendered = super().prepare(*args, **kw)
        self.prompts.append(rendered.text)
        return rendered


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
