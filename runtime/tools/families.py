"""Native tool-call syntaxes as data: one `ToolSyntax` per family, and `detect_syntax` for a template.

A syntax says how a model writes its calls (what llama-server's parsers in common/chat*.cpp read, and what
the family's template renders back for an assistant message with `tool_calls`):

- `shape` "json": each call is a JSON object `{name_key: NAME, args_key: {...}, id_key?: ID}` after
  `call_open` (Hermes `<tool_call>`, Granite `<|tool_call|>`, Command R7B `<|START_ACTION|>`), or, with
  `array`, one JSON array of such objects (Mistral Nemo `[TOOL_CALLS][...]`, Apriel `<tool_calls>[...]`);
- "name_json": `call_open` NAME [`id_open` ID] `name_close` [`args_open`] {json args} [`args_close`]
  `call_close` (Mistral Small 3.2 / Devstral / Magistral, DeepSeek V3.1 / R1, Kimi K2, Functionary v3.1);
- "xml": `call_open` `fn_open` NAME `fn_name_end` then per argument `param_open` KEY `param_name_end` VALUE
  `param_close`, then `fn_close` `call_close` (Qwen3-Coder / Qwen3.5 / Nemotron 3 / StepFun, GLM 4.5-4.7,
  MiniMax M2, Seed-OSS): values are raw text for string parameters (one newline after the opener and
  one before the closer belong to the syntax) and JSON for the others;
- "harmony": gpt-oss recipients (`to=functions.NAME` in the channel header, the arguments as the message).

`section_open` / `section_close` wrap all calls of a reply (DeepSeek `<｜tool▁calls▁begin｜>`, Kimi
`<|tool_calls_section_begin|>`, MiniMax `<minimax:tool_call>`). `id_style` is how ids are made when the
model writes none (`runtime.tools.calls.call_id`). `markers`: all must occur in the template source;
`FAMILIES` is in detection order (specific first), as llama-server's `common_chat_try_specialized_template`.
Adding a family is one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FAMILIES", "ToolSyntax", "by_name", "detect_syntax"]

Shape = Literal["json", "name_json", "xml", "harmony"]


@dataclass(frozen=True)
class ToolSyntax:
    """How one family writes tool calls (see the module docstring for the fields by shape)."""

    name: str
    shape: Shape
    markers: tuple[str, ...]
    call_open: str = ""
    call_close: str = ""
    section_open: str = ""
    section_close: str = ""
    # json
    name_key: str = "name"
    args_key: str = "arguments"
    id_key: str = ""
    id_first: bool = False  # the template writes the id before the name
    id_pattern: str = ""  # a JSON-schema pattern for written ids (Mistral: 9 alphanumerics)
    array: bool = False
    # name_json
    name_close: str = ""
    id_open: str = ""
    args_open: str = ""
    args_close: str = ""
    name_prefix: str = ""  # written before the name and not part of it (Kimi `functions.`)
    name_index: bool = False  # `:INDEX` after the name (Kimi), the id is the whole written name
    # xml
    fn_open: str = ""
    fn_name_end: str = ""
    fn_close: str = ""
    param_open: str = ""
    param_name_end: str = ""
    param_close: str = ""
    value_open: str = ""  # after the key's end and optional whitespace (GLM `<arg_value>`)
    value_newlines: bool = False  # one "\n" after the value opener and one before its closer are syntax
    # everything
    id_style: str = "openai"
    parallel: bool = True
    stops: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()  # none of these may occur in the template source

    @property
    def opener(self) -> str:
        """The text that starts the calls part of a reply (the lazy grammar's trigger)."""
        return self.section_open or self.call_open

    def matches(self, source: str) -> bool:
        """Whether a template source is of this family."""
        return all(m in source for m in self.markers) and not any(m in source for m in self.exclude)


HERMES = ToolSyntax("hermes", "json", ("<tool_call>",), call_open="<tool_call>", call_close="</tool_call>")

QWEN3_CODER = ToolSyntax(
    "qwen3_coder",
    "xml",
    ("<tool_call>", "<function=", "<parameter="),
    call_open="<tool_call>",
    call_close="</tool_call>",
    fn_open="<function=",
    fn_name_end=">",
    fn_close="</function>",
    param_open="<parameter=",
    param_name_end=">",
    param_close="</parameter>",
    value_newlines=True,
)

FAMILIES: tuple[ToolSyntax, ...] = (QWEN3_CODER, HERMES)


def detect_syntax(source: str) -> ToolSyntax | None:
    """The first family whose markers all occur in `source` (None: no native syntax known)."""
    return next((s for s in FAMILIES if s.matches(source)), None)


def by_name(name: str) -> ToolSyntax:
    """The family called `name` (KeyError if none)."""
    for syntax in FAMILIES:
        if syntax.name == name:
            return syntax
    raise KeyError(name)
