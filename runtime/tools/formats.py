"""Which tool-call format a chat template speaks, decided from the template source.

- The template renders tools itself (its Jinja reads the `tools` variable) and contains `<tool_call>`:
  `HermesFormat` (Qwen 2.5/3, Hermes 2 Pro/3 ...).
- It renders tools and is a Llama 3.x template (`<|start_header_id|>` with `"parameters"` or
  `<|python_tag|>`): `Llama3Format`.
- Anything else (no tools in the template, or a syntax this module does not know): `GenericFormat`, which
  describes the tools in the system message as llama-server's generic handling did.
"""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from runtime.tools.base import RenderPlan, ToolFormat
from runtime.tools.generic import GenericFormat, Render
from runtime.tools.hermes import HermesFormat
from runtime.tools.llama3 import Llama3Format

__all__ = ["detect_format", "render_prompt", "template_uses_tools"]


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
    it for the example call in its system text (without it, no example). `options` go to the format
    (`date_string` for Llama 3.x).
    """
    if template_uses_tools(source):
        if "<tool_call>" in source:
            return HermesFormat()
        if "<|start_header_id|>" in source and ('"parameters"' in source or "<|python_tag|>" in source):
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
