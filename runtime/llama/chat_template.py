"""Chat templating: a conversation rendered with the model's own Jinja template and tokenized.

`ChatTemplate` wraps llama-cpp-python's Jinja2 chat formatter (the GGUF `tokenizer.chat_template`)
and finds where each message starts in the tokens (the slot's checkpoint boundaries).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from caches.tokens import lcp
from runtime.backend.protocol import RenderedChat
from runtime.errors import ModelLoadError
from runtime.tools import ToolFormat, detect_format

Tokenize = Callable[[str], list[int]]


class ChatTemplate:
    """The model's chat template: renders message lists to text and to tokens."""

    def __init__(self, template: str | None, *, eos: str, bos: str, tokenize: Tokenize, model: str = "") -> None:
        self.source = template
        self._eos, self._bos = eos, bos
        self._tokenize = tokenize
        self._model = model
        self._formatter: Any = None
        self._generation_prompt: str | None = None
        self._tool_format: ToolFormat | None = None

    def _chat_formatter(self) -> Any:
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            if not self.source:
                raise ModelLoadError(self._model, "the model has no chat template (tokenizer.chat_template)")
            self._formatter = Jinja2ChatFormatter(
                template=self.source, eos_token=self._eos, bos_token=self._bos, add_generation_prompt=True
            )
        return self._formatter

    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The template's text for `messages` (and the `tools` variable and other variables, if given)."""
        fmt = self._chat_formatter()
        fmt.add_generation_prompt = add_generation_prompt
        try:
            return str(fmt(messages=list(messages), tools=tools, **(template_kwargs or {})).prompt)
        finally:
            fmt.add_generation_prompt = True

    def generation_prompt(self) -> str:
        """What the template appends for the assistant's turn (llama-server's `generation_prompt`)."""
        if self._generation_prompt is None:
            probe = [{"role": "user", "content": "x"}]
            bare = self.render_text(probe, add_generation_prompt=False)
            full = self.render_text(probe, add_generation_prompt=True)
            self._generation_prompt = full[len(bare) :] if full.startswith(bare) else ""
        return self._generation_prompt

    def tool_format(self) -> ToolFormat:
        """The tool-call format of this template (computed once)."""
        if self._tool_format is None:
            eos = self._eos

            def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
                return self.render_text(messages, add_generation_prompt=add_generation_prompt)

            self._tool_format = detect_format(self.source or "", render, eos)
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
