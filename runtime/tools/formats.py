"""Which tool-call format a chat template speaks, decided from the template source.

- The template renders tools itself (its Jinja reads the `tools` variable) and contains `<tool_call>` and
  a JSON `{"name":`: `HermesFormat` (Qwen 2.5/3, QwQ, Hermes 2 Pro/3, Granite 4 ...).
- It renders tools and is a Llama 3.x template (`<|start_header_id|>ipython<|end_header_id|>`, the
  test llama-server uses): `Llama3Format`.
- Anything else (no tools in the template, or a syntax this module does not know, such as the XML-style
  `<function=...>` / `<arg_key>` calls): `GenericFormat`, which
  describes the tools in the system message as llama-server's generic handling did.
"""

from __future__ import annotations

import re
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from runtime.tools.base import RenderPlan, ToolFormat
from runtime.tools.generic import GenericFormat, Render
from runtime.tools.hermes import HermesFormat
from runtime.tools.llama3 import Llama3Format

__all__ = ["detect_format", "render_prompt", "template_uses_tools"]

_JSON_NAME = re.compile(r'\{\\?"name\\?":')  # {"name": in the template, or {\"name\": inside a string
# XML-style call syntaxes that also use <tool_call> (Qwen3-Coder / Qwen3.5 / Nemotron 3, GLM, Ling, Laguna,
# functionary) and Apriel's <tool_calls>[...]: not handled here, so they get the generic format
_OTHER_SYNTAX = ("<function=", "<arg_key>", "<parameter=", "<invoke name=", "<tool_calls>")


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
    if template_uses_tools(source) and not any(marker in source for marker in _OTHER_SYNTAX):
        if "<tool_call>" in source and _JSON_NAME.search(source):
            return HermesFormat()
        if "<|start_header_id|>ipython<|end_header_id|>" in source:  # llama-server's test for Llama 3.x
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
