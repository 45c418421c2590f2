"""Chat templating for the engine: a conversation rendered with `runtime.templates.apply_template` (exactly
llama-server's render) and tokenized, and where each message starts in the tokens (the slot's checkpoint
boundaries).

`ChatTemplate` knows the model's templates (`runtime.templates.load`: an override, the GGUF's default and
`tool_use` templates, or ChatML), its BOS / EOS text and whether its tokenizer adds BOS / EOS itself (then a
leading BOS / trailing EOS the template writes is removed, as llama-server does), so the prompt a turn runs is
`apply_template`'s string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from caches.tokens import lcp
from runtime.backend.protocol import RenderedChat
from runtime.templates import apply_template
from runtime.templates.load import TemplateSources, choose_templates
from runtime.tools import ToolFormat, detect_format

Tokenize = Callable[[str], list[int]]


class ChatTemplate:
    """The model's chat template: renders message lists to text and to tokens."""

    def __init__(
        self,
        template: str | None,
        *,
        eos: str,
        bos: str,
        tokenize: Tokenize,
        model: str = "",
        tool_use: str | None = None,
        override: str | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> None:
        self.sources: TemplateSources = choose_templates(override, template, tool_use, model=model)
        self._inputs = {"template": template, "tool_use": tool_use, "override": override}
        self.source = self.sources.default
        self._eos, self._bos = eos, bos
        self._add_bos, self._add_eos = add_bos, add_eos
        self._tokenize = tokenize
        self._model = model
        self._generation_prompt: str | None = None
        self._tool_format: ToolFormat | None = None

    def settings(self) -> dict[str, Any]:
        """What this template was made from (JSON-able): `ChatTemplate(**settings, tokenize=...)` renders the
        same text without the model (the pytest plugin's replay keeps it in a cassette)."""
        flags = {"add_bos": self._add_bos, "add_eos": self._add_eos}
        return {**self._inputs, "eos": self._eos, "bos": self._bos, "model": self._model, **flags}

    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The template's text for `messages` (and the `tools` variable and other variables, if given)."""
        return apply_template(
            self.sources.for_tools(bool(tools)),
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=template_kwargs,
            bos_token=self._bos,
            eos_token=self._eos,
            add_bos=self._add_bos,
            add_eos=self._add_eos,
        )

    def generation_prompt(self) -> str:
        """What the template appends for the assistant's turn (llama-server's `generation_prompt`)."""
        if self._generation_prompt is None:
            probe = [{"role": "user", "content": "x"}]
            bare = self.render_text(probe, add_generation_prompt=False)
            full = self.render_text(probe, add_generation_prompt=True)
            n = 0  # llama-server: what follows the common prefix of the two renders
            for a, b in zip(bare, full, strict=False):
                if a != b:
                    break
                n += 1
            self._generation_prompt = full[n:]
        return self._generation_prompt

    def tool_format(self) -> ToolFormat:
        """The tool-call format of this template (computed once)."""
        if self._tool_format is None:
            eos = self._eos

            def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
                return self.render_text(messages, add_generation_prompt=add_generation_prompt)

            self._tool_format = detect_format(self.sources.for_tools(True), render, eos)
        return self._tool_format

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        spans: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedChat:
        """Render a chat with the model's own template, tokenize it and find each message's first token.

        Finding the starts tokenizes every prefix of the chat; `spans=False` skips it (only models that take
        checkpoints need them) and leaves `message_starts` empty.
        """
        extra: dict[str, Any] = {"tools": tools, "template_kwargs": template_kwargs}
        text = self.render_text(messages, add_generation_prompt=add_generation_prompt, **extra)
        tokens = self._tokenize(text)
        if not spans:
            return RenderedChat(text=text, tokens=tokens, message_starts=[], roles=[])
        starts: list[int] = [0] if messages else []
        for i in range(1, len(messages)):
            # message i starts where the rendering of the messages before it stops matching
            part = self._tokenize(self.render_text(messages[:i], add_generation_prompt=False, **extra))
            starts.append(lcp(part, tokens))
        return RenderedChat(text=text, tokens=tokens, message_starts=starts, roles=[m["role"] for m in messages])
