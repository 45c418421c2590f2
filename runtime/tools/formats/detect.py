"""Which tool-call format a chat template speaks, decided from the template source.

- The template renders tools itself (its Jinja reads the `tools` variable) and its source matches a
  family of `runtime.tools.syntax.families` (detection order: specific markers first): that family's
  `SyntaxFormat` (Hermes `<tool_call>` JSON for Qwen 2.5/3, Hermes 2 Pro/3 ...; the XML-style,
  bracketed and tagged families llama-server parses). A template that renders tool calls but not the
  tools (DeepSeek V3.1, the R1 distills, FireFunction v2) is native too, as llama-server's autoparser
  treats it. The template's reasoning tags keep the grammar out of the reasoning block. Whether the
  template gets arguments as objects or JSON strings is the renderer's business (llama-server's caps:
  `runtime.templates`); `SyntaxFormat.args_string` records it.
- It renders tools and is a Llama 3.x template (`<|start_header_id|>ipython<|end_header_id|>`, the
  test llama-server uses): `Llama3Format`.
- Anything else (no tools in the template, or a syntax no family knows): `GenericFormat`, which
  describes the tools in the system message as llama-server's generic handling did.
"""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from runtime import reasoning as reasoning_formats
from runtime.templates import apply_template
from runtime.templates.caps import template_caps
from runtime.tools.formats.base import RenderPlan, ToolFormat
from runtime.tools.formats.generic import GenericFormat, Render
from runtime.tools.formats.llama3 import Llama3Format
from runtime.tools.formats.native import HermesFormat, SyntaxFormat
from runtime.tools.syntax.families import HERMES, detect_syntax

__all__ = ["detect_format", "render_prompt", "template_uses_tools"]


def _generation_prompt(source: str) -> str:
    """The prompt for one user message with the template's default variables ("" if the template refuses)."""
    try:
        return apply_template(source, [{"role": "user", "content": "x"}])
    except Exception:  # a template may refuse a lone user message: no reasoning facts from it
        return ""


def template_uses_tools(source: str) -> bool:
    """True when the Jinja template reads the `tools` variable (so it renders tool definitions itself)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        ast = env.parse(source)
    except jinja2.TemplateSyntaxError:
        return "tools" in source
    return "tools" in jinja2.meta.find_undeclared_variables(ast)


def detect_format(source: str, render: Render | None = None, eos_token: str = "", **options: Any) -> ToolFormat:
    """The format for a chat template's `source`.

    `render(messages, add_generation_prompt) -> str` renders with that template; the generic format uses
    it for the example call in its system text and the native ones for the arguments probe (without it,
    no example, arguments as objects). `options` go to the format (`date_string` for Llama 3.x).
    """
    caps = template_caps(source)
    if template_uses_tools(source) or caps.supports_tool_calls:  # llama-server's autoparser reads either
        syntax = detect_syntax(source)
        if syntax is not None:
            fmt = reasoning_formats.detect(source)
            tags = (fmt.start, fmt.end) if fmt is not None else None
            inside = fmt is not None and fmt.opens_block(_generation_prompt(source))
            cls = HermesFormat if syntax is HERMES else SyntaxFormat
            return cls(syntax, args_string=not caps.supports_object_arguments, reasoning=tags, inside=inside)
        if (
            template_uses_tools(source) and "<|start_header_id|>ipython<|end_header_id|>" in source
        ):  # llama-server's test for Llama 3.x
            return Llama3Format(date_string=options.get("date_string"))
    if render is None:
        return GenericFormat()
    return GenericFormat.for_template(render, eos_token)


def render_prompt(formatter: Any, plan: RenderPlan, *, add_generation_prompt: bool = True) -> str:
    """Render a `RenderPlan` with llama-cpp-python's `Jinja2ChatFormatter` (which passes `tools` on)."""
    saved = formatter.add_generation_prompt
    formatter.add_generation_prompt = add_generation_prompt
    try:
        return str(formatter(messages=plan.messages, tools=plan.tools, **plan.kwargs).prompt)
    finally:
        formatter.add_generation_prompt = saved
