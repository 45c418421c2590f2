"""Which tool-call format a chat template speaks, decided from the template source.

- The template renders tools itself (its Jinja reads the `tools` variable) and its source matches a
  family of `runtime.tools.families` (detection order: specific markers first): that family's
  `SyntaxFormat` (Hermes `<tool_call>` JSON for Qwen 2.5/3, Hermes 2 Pro/3, SmolLM3 ...; the XML-style,
  bracketed and tagged families llama-server parses). A probe render decides whether the template wants
  tool-call arguments as objects or as JSON strings; the template's reasoning tags keep the grammar out of
  the reasoning block.
- It renders tools and is a Llama 3.x template (`<|start_header_id|>ipython<|end_header_id|>`, the
  test llama-server uses): `Llama3Format`.
- Anything else (no tools in the template, or a syntax no family knows): `GenericFormat`, which
  describes the tools in the system message as llama-server's generic handling did.
"""

from __future__ import annotations

import json
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from runtime import reasoning as reasoning_formats
from runtime.tools.base import RenderPlan, ToolFormat
from runtime.tools.families import HERMES, detect_syntax
from runtime.tools.generic import GenericFormat, Render
from runtime.tools.hermes import HermesFormat
from runtime.tools.llama3 import Llama3Format
from runtime.tools.syntax import SyntaxFormat, string_arguments

__all__ = ["detect_format", "render_prompt", "template_uses_tools", "wants_string_arguments"]

_PROBE_ARGS = {"probe_key": "probe_value"}
_PROBE: list[dict[str, Any]] = [
    {"role": "user", "content": "x"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "probe_tool", "arguments": _PROBE_ARGS}}
        ],
    },
]


def wants_string_arguments(render: Render | None) -> bool:
    """Whether the template renders tool-call arguments given as a JSON string (and not as an object): it
    prints `arguments` as it is, so an object would come out as a Python dict. False when unsure."""
    if render is None:
        return False
    try:
        as_object = render(_PROBE, False)
    except Exception:
        as_object = None
    if as_object is not None and "probe_value" in as_object and "{'probe_key'" not in as_object:
        return False
    try:
        as_string = render(string_arguments(_PROBE), False)
    except Exception:
        return False
    return json.dumps(_PROBE_ARGS) in as_string or '"probe_key"' in as_string


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
    if template_uses_tools(source):
        syntax = detect_syntax(source)
        if syntax is not None:
            fmt = reasoning_formats.detect(source)
            tags = (fmt.start, fmt.end) if fmt is not None and syntax.shape != "harmony" else None
            cls = HermesFormat if syntax is HERMES else SyntaxFormat
            return cls(syntax, args_string=wants_string_arguments(render), reasoning=tags)
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
