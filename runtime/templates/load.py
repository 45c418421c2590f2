"""Where a chat template comes from: a `chat_template=` value (Jinja source or a path to a file) and the GGUF's
templates, chosen as llama-server chooses (common_chat_templates_init).

- An override (`Runtime.open(chat_template=...)`, `turnstile serve --chat-template-file`) replaces the GGUF's
  templates, its `tool_use` variant included; a name of llama.cpp's built-in templates (`"chatml"`,
  `"llama3"`, `"command-r"`, ...: runtime.templates.builtin) stands for that template.
- Otherwise the GGUF's `tokenizer.chat_template`, and `tokenizer.chat_template.tool_use` for turns that offer
  tools (Hermes 2 Pro / 3, Command R+); a GGUF with only a `tool_use` template uses it for every turn.
- Neither: ChatML, with a logged warning (`template.fallback`).

llama.cpp's two source patches (gpt-oss's channel check, a Mistral content check) are applied to every source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import InvalidConfig
from runtime.log import get_logger
from runtime.templates.apply import CHATML_TEMPLATE
from runtime.templates.builtin import BUILTIN, builtin_source

__all__ = ["TemplateSources", "chat_template_source", "choose_templates"]

log = get_logger(__name__)

_MAX_TEMPLATE_BYTES = 1 << 20


def chat_template_source(value: str | os.PathLike[str]) -> str:
    """The Jinja source a `chat_template=` value stands for: itself when it holds Jinja (`{{` / `{%`), else
    the text of the file it names (`.jinja` or any other). Raises InvalidConfig when that file is missing."""
    if isinstance(value, str) and ("{{" in value or "{%" in value):
        return value
    if isinstance(value, str) and not os.path.exists(value):
        try:
            builtin = builtin_source(value)
        except KeyError as e:
            raise InvalidConfig(str(e.args[0])) from None
        if builtin is not None:
            return builtin
        if "/" not in value and os.sep not in value and "." not in value:
            raise InvalidConfig(
                f"unknown chat template name {value[:80]!r}: llama.cpp's names turnstile renders are "
                f"{', '.join(sorted(BUILTIN))}; or give Jinja source, or a template file"
            )
    if not isinstance(value, str | os.PathLike):
        raise InvalidConfig(f"chat_template must be Jinja source or a path, not {type(value).__name__}")
    path = Path(value)
    try:
        if path.stat().st_size > _MAX_TEMPLATE_BYTES:
            raise InvalidConfig(f"chat template file {path} is larger than {_MAX_TEMPLATE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidConfig(f"chat_template {str(value)[:200]!r} is no Jinja source and no readable file: {e}") from e
    if not text.strip():
        raise InvalidConfig(f"chat template file {path} is empty")
    return text


def _patched(src: str) -> str:
    """llama.cpp's temporary source patches (common_chat_templates_init)."""
    if "<|channel|>" in src and "in message.content or" in src:
        src = src.replace(
            '{%- if "<|channel|>analysis<|message|>" in message.content or '
            '"<|channel|>final<|message|>" in message.content %}',
            "{%- if false %}",
        )
    if "[TOOL_CALLS]" in src and "if (message['content'] is none or" in src:
        src = src.replace(
            "{%- if (message['content'] is none or message['content'] == '' or "
            "message['content']|length == 0) and (message['tool_calls'] is not defined or "
            "message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
            "{%- if false %}",
        )
    return src


@dataclass(frozen=True)
class TemplateSources:
    """The template for plain turns and the one for turns that offer tools (often the same)."""

    default: str
    tool_use: str | None = None
    fallback: bool = False  # ChatML because the model has no template

    def for_tools(self, tools: bool) -> str:
        return self.tool_use if tools and self.tool_use else self.default


def choose_templates(
    override: str | None, gguf_default: str | None, gguf_tool_use: str | None, *, model: str = ""
) -> TemplateSources:
    """The templates a model renders with (see the module docstring)."""
    if override:
        return TemplateSources(_patched(override))
    default, tool_use = gguf_default or "", gguf_tool_use or None
    fallback = False
    if not default or default == "chatml":
        if tool_use:
            default = tool_use
        else:
            if not default:
                log.warning("template.fallback", model=model, reason="the model has no chat template", using="chatml")
            default, fallback = CHATML_TEMPLATE, not default
    return TemplateSources(_patched(default), _patched(tool_use) if tool_use else None, fallback)
