"""`ToolSyntax`: how one family writes tool calls, as data (the families are in runtime.tools.syntax.families).

A syntax says how a model writes its calls (what llama-server's parsers in common/chat*.cpp read, and what
the family's template renders back for an assistant message with `tool_calls`). What every family has is
on `ToolSyntax`; what only one way of writing a call needs is on its shape, one small frozen class each
(the parsers and the grammar dispatch on the shape's type):

- `JsonShape`: each call is a JSON object `{name_key: NAME, args_key: {...}, id_key?: ID}` after
  `call_open` (Hermes `<tool_call>`, Granite `<|tool_call|>`, Command R7B `<|START_ACTION|>`), or, with
  `array`, one JSON array of such objects (Mistral Nemo `[TOOL_CALLS][...]`, Apriel `<tool_calls>[...]`);
- `NameJsonShape`: `call_open` NAME [`id_open` ID] `name_close` [`args_open`] {json args} [`args_close`]
  `call_close` (Mistral Small 3.2 / Devstral / Magistral, DeepSeek V3.1 / R1, Kimi K2, Functionary v3.1);
  Functionary v3.2 writes `>>>NAME\n{json}` after a generation prompt that ends with `>>>`, its content
  as the message to the recipient `all` (`content_recipient`);
- `XmlShape`: `call_open` `fn_open` NAME `fn_name_end` then per argument `param_open` KEY `param_name_end`
  VALUE `param_close`, then `fn_close` `call_close` (Qwen3-Coder / Qwen3.5 / Nemotron 3 / StepFun, GLM
  4.5-4.7, MiniMax M2 / M3, Seed-OSS, Kimi K3, Muse Glimmer): values are raw text for string parameters
  (with `value_newlines`, one newline after the opener and one before the closer belong to the syntax) and
  JSON for the others;
- `PythonicShape`: LFM2's `[NAME(key=value, ...), ...]`, values Python literals;
- `GemmaShape`: Gemma 4's `<|tool_call>call:NAME{key:value,...}<tool_call|>`, strings in `<|"|>` quotes;
- `HarmonyShape`: gpt-oss recipients (`to=functions.NAME` in the channel header, the arguments as the
  message).

`section_open` / `section_close` wrap all calls of a reply (DeepSeek `<｜tool▁calls▁begin｜>`, Kimi
`<|tool_calls_section_begin|>`, MiniMax `<minimax:tool_call>`). `id_style` is how ids are made when the
model writes none (`runtime.tools.calls.call_id`). `markers`: all must occur in the template source (the
first family in `runtime.tools.syntax.families.FAMILIES` whose markers match is the template's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "GemmaShape",
    "HarmonyShape",
    "JsonShape",
    "NameJsonShape",
    "PythonicShape",
    "Shape",
    "ToolSyntax",
    "XmlShape",
    "invoke_tags",
]


@dataclass(frozen=True)
class JsonShape:
    """Each call a JSON object (or, with `array`, one JSON array of them)."""

    name_key: str = "name"
    args_key: str = "arguments"
    id_key: str = ""
    id_first: bool = False  # the template writes the id before the name
    id_pattern: str = ""  # a JSON-schema pattern for written ids (Mistral: 9 alphanumerics)
    array: bool = False
    name_is_key: bool = False  # `{NAME: {args}}` (Apertus)
    args_open: str = ""  # a fence around the JSON (Command R+ ```json)
    args_close: str = ""


@dataclass(frozen=True)
class NameJsonShape:
    """The name as text, then the arguments as a JSON object."""

    name_close: str
    id_open: str = ""
    id_before: str = ""  # the id comes first, right after `call_open`, up to this (Solar Open)
    args_open: str = ""
    args_close: str = ""
    name_prefix: str = ""  # written before the name and not part of it (Kimi `functions.`)
    name_index: bool = False  # `:INDEX` after the name (Kimi), the id is the whole written name
    # the generation prompt ends with `call_open`, so the output starts with a recipient: this one's message
    # is the content (Functionary v3.2's `all`), any other is a call
    content_recipient: str = ""


@dataclass(frozen=True)
class XmlShape:
    """Tagged function and parameters; a string parameter's value is its raw text."""

    param_open: str
    param_name_end: str
    param_close: str
    fn_open: str = ""
    fn_name_end: str = ""  # "": the name ends at a newline or the first tag (GLM)
    fn_close: str = ""
    fn_head_end: str = ""  # after the name, the rest of the call's header up to this is skipped (Kimi K3)
    value_open: str = ""  # after the key's end and optional whitespace (GLM `<arg_value>`)
    value_newlines: bool = False  # one "\n" after the value opener and one before its closer are syntax
    param_close_named: bool = False  # the closer is `param_close` KEY `param_name_end` (MiniMax M3's `</KEY>`)
    param_typed: tuple[str, str] = ("", "")  # written after the key for string / other values (DeepSeek V3.2)
    # the first call may also start at this + an offered tool's name + `fn_name_end` without `call_open`
    # (Qwen3-Coder's `<function=NAME>`, as llama-server accepts and triggers on); the text before such a call
    # keeps its trailing whitespace (no opener took it)
    bare_open: str = ""
    # a regex (anchored at the end) for a header written before each opener and dropped from the content
    # (Muse Glimmer's `<|eom|><|start|>assistant to=NAME` recipient); in a prefix, text from `head_start` on
    # that may still become one is held back
    head: str = ""
    head_start: str = ""
    head_gbnf: str = ""  # the grammar for that header (optional before each call)


def invoke_tags(prefix: str = "") -> XmlShape:
    """The `<PREFIXinvoke name="NAME">` / `<PREFIXparameter name="KEY">` tags (MiniMax M2, DeepSeek's DSML,
    Muse Glimmer's ATEM markup); `dataclasses.replace` adds a family's other fields."""
    return XmlShape(
        fn_open=f'<{prefix}invoke name="',
        fn_name_end='">',
        fn_close=f"</{prefix}invoke>",
        param_open=f'<{prefix}parameter name="',
        param_name_end='">',
        param_close=f"</{prefix}parameter>",
    )


@dataclass(frozen=True)
class PythonicShape:
    """LFM2: a Python list of calls, `[NAME(key=value, ...), ...]`."""


@dataclass(frozen=True)
class GemmaShape:
    """Gemma 4: `NAME{key:value,...}`, strings in `<|"|>` quotes."""


@dataclass(frozen=True)
class HarmonyShape:
    """gpt-oss: the call is a message to the recipient `functions.NAME`, its arguments JSON."""


Shape = JsonShape | NameJsonShape | XmlShape | PythonicShape | GemmaShape | HarmonyShape


@dataclass(frozen=True)
class ToolSyntax:
    """How one family writes tool calls (see the module docstring; the shape's own fields are on `shape`)."""

    name: str
    shape: Shape
    markers: tuple[str, ...]
    call_open: str = ""
    call_close: str = ""
    section_open: str = ""
    section_close: str = ""
    id_style: str = "openai"
    parallel: bool = True
    stops: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()  # none of these may occur in the template source
    tools_variable: str = ""  # the template reads the tools as JSON text from this variable (FireFunction v2)
    pattern: str = ""  # a regex that must also match the template source

    def __post_init__(self) -> None:
        if not self.opener:
            raise ValueError(f"tool syntax {self.name}: a syntax needs a call or section opener")

    @property
    def opener(self) -> str:
        """The text that starts the calls part of a reply (the lazy grammar's trigger)."""
        return self.section_open or self.call_open

    def matches(self, source: str) -> bool:
        """Whether a template source is of this family."""
        if not all(m in source for m in self.markers) or any(m in source for m in self.exclude):
            return False
        return not self.pattern or re.search(self.pattern, source) is not None
