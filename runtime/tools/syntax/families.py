"""Native tool-call syntaxes as data: one `ToolSyntax` (runtime.tools.syntax.shapes, which says what the fields
mean, shape by shape) per family, and `detect_syntax` for a template. `FAMILIES` is in detection order (specific
first), as llama-server's `common_chat_try_specialized_template`. Adding a family is one entry here.
"""

from __future__ import annotations

from dataclasses import replace

from runtime.tools.syntax.shapes import (
    GemmaShape,
    HarmonyShape,
    JsonShape,
    NameJsonShape,
    PythonicShape,
    ToolSyntax,
    XmlShape,
    invoke_tags,
)

__all__ = ["FAMILIES", "ToolSyntax", "by_name", "detect_syntax"]

_FUNCTION_TAGS = XmlShape(  # `<function=NAME>` and `<parameter=KEY>` (Qwen3-Coder, Seed-OSS)
    fn_open="<function=",
    fn_name_end=">",
    fn_close="</function>",
    param_open="<parameter=",
    param_name_end=">",
    param_close="</parameter>",
)
_DSML = invoke_tags("｜DSML｜")  # DeepSeek's DSML tags; `string="true"` / `"false"` types a parameter
_DSML_TYPED = replace(_DSML, param_typed=('" string="true', '" string="false'))

KIMI_K3 = ToolSyntax(  # XTML tags from <|open|> / <|close|> / <|sep|>; a parameter's type is an attribute
    "kimi_k3",
    XmlShape(
        fn_open='<|open|>call tool="',
        fn_name_end='"',
        fn_head_end="<|sep|>",
        fn_close="<|close|>call<|sep|>",
        param_open='<|open|>argument key="',
        param_name_end="<|sep|>",
        param_close="<|close|>argument<|sep|>",
        param_typed=('" type="string"', '" type="number"'),
    ),
    ("<|open|>", "<|close|>", "<|end_of_msg|>"),
    section_open="<|open|>tools<|sep|>",
    section_close="<|close|>tools<|sep|>",
    stops=("<|close|>message<|sep|>",),  # the message's end: the model writes <|end_of_msg|> next
)
MUSE_GLIMMER = ToolSyntax(  # `<|start|>assistant to=NAME<|message|>` then ATEM markup, one call per message
    "muse_glimmer",
    replace(
        invoke_tags("atem:"),
        head=r"(?:<\|eom\|>)?\s*(?:<\|start\|>assistant)?\s*to=[^<\s]*\s*$",
        head_start=" to=",
        head_gbnf='( ( "<|eom|>" "<|start|>assistant" )? " "? "to=" [^<]* )?',
    ),
    ("<atem:function_calls>", "<|eom|>"),
    call_open="<|message|><atem:function_calls>",
    call_close="</atem:function_calls>",
)
HERMES = ToolSyntax(  # {"name": in the template, or {\"name\": inside a string
    "hermes",
    JsonShape(),
    ("<tool_call>",),
    call_open="<tool_call>",
    call_close="</tool_call>",
    pattern=r'\{\\?"name\\?":',
)

QWEN3_CODER = ToolSyntax(  # Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, StepFun 3.5
    "qwen3_coder",
    replace(_FUNCTION_TAGS, value_newlines=True, bare_open="<function="),
    ("<tool_call>", "<function=", "<parameter="),
    call_open="<tool_call>",
    call_close="</tool_call>",
)
SEED_OSS = ToolSyntax(
    "seed_oss", _FUNCTION_TAGS, ("<seed:tool_call>",), call_open="<seed:tool_call>", call_close="</seed:tool_call>"
)
GLM = ToolSyntax(  # GLM 4.5 / 4.6 / 4.7, Ling 3.0
    "glm",
    XmlShape(param_open="<arg_key>", param_name_end="</arg_key>", value_open="<arg_value>", param_close="</arg_value>"),
    ("<tool_call>", "<arg_key>"),
    call_open="<tool_call>",
    call_close="</tool_call>",
)
HY3 = ToolSyntax(  # Tencent Hunyuan 3
    "hy3",
    XmlShape(
        fn_name_end="<tool_sep:opensource>",
        param_open="<arg_key:opensource>",
        param_name_end="</arg_key:opensource>",
        value_open="<arg_value:opensource>",
        param_close="</arg_value:opensource>",
    ),
    ("'<tool_call{}>'.format(HYTK)", "':opensource'"),
    section_open="<tool_calls:opensource>",
    section_close="</tool_calls:opensource>",
    call_open="<tool_call:opensource>",
    call_close="</tool_call:opensource>",
)
MINIMAX_M2 = ToolSyntax(
    "minimax_m2",
    invoke_tags(),
    ("<minimax:tool_call>", "<invoke name="),
    section_open="<minimax:tool_call>",
    section_close="</minimax:tool_call>",
    exclude=("]<]minimax[>[",),
)
_MM = "]<]minimax[>["
MINIMAX_M3 = ToolSyntax(  # every tag after the `]<]minimax[>[` namespace token, a parameter's tag is its key
    "minimax_m3",
    XmlShape(
        fn_open=_MM + '<invoke name="',
        fn_name_end='">',
        fn_close=_MM + "</invoke>",
        param_open=_MM + "<",
        param_name_end=">",
        param_close=_MM + "</",
        param_close_named=True,
    ),
    (_MM, "<invoke name="),
    section_open=_MM + "<tool_call>",
    section_close=_MM + "</tool_call>",
)
DEEPSEEK_V3_2 = ToolSyntax(  # DeepSeek V3.2 (DSML)
    "deepseek_v3_2",
    _DSML_TYPED,
    ("dsml_token", "function_calls"),
    section_open="<｜DSML｜function_calls>",
    section_close="</｜DSML｜function_calls>",
)
DEEPSEEK_V4 = ToolSyntax(  # DeepSeek V4 (DSML, `tool_calls` blocks)
    "deepseek_v4",
    _DSML_TYPED,
    ("dsml_token", "tool_calls>"),
    section_open="<｜DSML｜tool_calls>",
    section_close="</｜DSML｜tool_calls>",
    exclude=("function_calls",),
)
MINICPM5 = ToolSyntax(
    "minicpm5",
    XmlShape(fn_name_end='">', param_open='<param name="', param_name_end='">', param_close="</param>"),
    ("Tool usage guidelines:", '<function name="', '<param name="'),
    call_open='<function name="',
    call_close="</function>",
)
MISTRAL_SMALL = ToolSyntax(  # Mistral Small 3.2: ids in [CALL_ID]
    "mistral_small",
    NameJsonShape(id_open="[CALL_ID]", name_close="[ARGS]"),
    ("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"),
    call_open="[TOOL_CALLS]",
    id_style="mistral",
)
MISTRAL_ARGS = ToolSyntax(  # Devstral, Magistral, Ministral 3
    "mistral_args",
    NameJsonShape(name_close="[ARGS]"),
    ("[TOOL_CALLS]", "[ARGS]"),
    call_open="[TOOL_CALLS]",
    id_style="mistral",
)
MISTRAL_NEMO = ToolSyntax(
    "mistral_nemo",
    JsonShape(array=True, id_key="id", id_pattern="^[a-zA-Z0-9]{9}$"),
    ("[TOOL_CALLS]",),
    call_open="[TOOL_CALLS]",
    id_style="mistral",
)
KIMI_K2 = ToolSyntax(
    "kimi_k2",
    NameJsonShape(name_prefix="functions.", name_index=True, name_close="<|tool_call_argument_begin|>"),
    ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
    section_open="<|tool_calls_section_begin|>",
    section_close="<|tool_calls_section_end|>",
    call_open="<|tool_call_begin|>",
    call_close="<|tool_call_end|>",
    id_style="kimi",
)
DEEPSEEK_R1 = ToolSyntax(  # DeepSeek R1 and its distills: `function<｜tool▁sep｜>NAME` and a ```json fence
    "deepseek_r1",
    NameJsonShape(name_close="\n```json\n", args_close="```"),
    ("<｜tool▁calls▁begin｜>", "```json"),
    section_open="<｜tool▁calls▁begin｜>",
    section_close="<｜tool▁calls▁end｜>",
    call_open="<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
    call_close="<｜tool▁call▁end｜>",
)
DEEPSEEK_V3_1 = ToolSyntax(
    "deepseek_v3_1",
    NameJsonShape(name_close="<｜tool▁sep｜>"),
    ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"),
    section_open="<｜tool▁calls▁begin｜>",
    section_close="<｜tool▁calls▁end｜>",
    call_open="<｜tool▁call▁begin｜>",
    call_close="<｜tool▁call▁end｜>",
)
SOLAR_OPEN = ToolSyntax(
    "solar_open",
    NameJsonShape(id_before="<|tool_call:name|>", name_close="<|tool_call:args|>"),
    ("<|tool_call:begin|>", "<|tool_call:name|>"),
    section_open="<|tool_calls|>",
    section_close="<|calls|>",
    call_open="<|tool_call:begin|>",
    call_close="<|tool_call:end|>",
)
FUNCTIONARY_V3_1 = ToolSyntax(  # also a Llama 3.1 template: checked before Llama 3.x
    "functionary_v3_1",
    NameJsonShape(name_close=">"),
    ("<function=",),
    call_open="<function=",
    call_close="</function>",
    stops=("<|eom_id|>",),
)
_COHERE = JsonShape(array=True, name_key="tool_name", args_key="parameters")
COMMAND_R7B = ToolSyntax(  # Command R7B, Cohere2 MoE
    "command_r7b",
    replace(_COHERE, id_key="tool_call_id", id_first=True),
    ("<|START_ACTION|>",),
    call_open="<|START_ACTION|>",
    call_close="<|END_ACTION|>",
)
COMMAND_R_PLUS = ToolSyntax(  # Action: and a ```json fence around the list
    "command_r_plus",
    replace(_COHERE, args_open="```json", args_close="```"),
    ("Action:", "<|CHATBOT_TOKEN|>"),
    call_open="Action:",
    exclude=("<|START_ACTION|>",),
)
APRIEL = ToolSyntax(  # Apriel 1.5 / 1.6
    "apriel",
    JsonShape(array=True, id_key="id"),
    ("<tool_calls>[",),
    call_open="<tool_calls>",
    call_close="</tool_calls>",
)
MINIMAX_M1 = ToolSyntax(
    "minimax_m1",
    JsonShape(),
    ("<tool_calls>", "<beginning_of_sentence>"),
    section_open="<tool_calls>",
    section_close="</tool_calls>",
)
_ARRAY = JsonShape(array=True)
NEMOTRON_V2 = ToolSyntax("nemotron_v2", _ARRAY, ("<TOOLCALL>",), call_open="<TOOLCALL>", call_close="</TOOLCALL>")
GRANITE = ToolSyntax("granite", _ARRAY, ("<|tool_call|>",), call_open="<|tool_call|>")
APERTUS = ToolSyntax(
    "apertus",
    JsonShape(array=True, name_is_key=True),
    ("<|tools_prefix|>",),
    call_open="<|tools_prefix|>",
    call_close="<|tools_suffix|>",
)
FIREFUNCTION_V2 = ToolSyntax(
    "firefunction_v2", _ARRAY, ("functools[",), call_open="functools", tools_variable="functions"
)
FUNCTIONARY_V3_2 = ToolSyntax(
    "functionary_v3_2",
    NameJsonShape(name_close="\n", content_recipient="all"),
    (">>>all", ">>>${recipient}"),
    call_open=">>>",
)
GIGACHAT3 = ToolSyntax(  # one call, as a message of its own after the content
    "gigachat3",
    JsonShape(),
    ("<|role_sep|>", "<|message_sep|>", "function call"),
    call_open="<|message_sep|>\n\nfunction call<|role_sep|>",
    parallel=False,
    exclude=("<|function_call|>",),
)
GIGACHAT3_1 = ToolSyntax(
    "gigachat3_1", JsonShape(), ("<|role_sep|>", "<|function_call|>"), call_open="<|function_call|>", parallel=False
)
GEMMA4 = ToolSyntax(  # the template writes `<|tool_response>` after the calls: the model stops there for the results
    "gemma4",
    GemmaShape(),
    ("'<|tool_call>call:'",),
    call_open="<|tool_call>call:",
    call_close="<tool_call|>",
    stops=("<|tool_response>",),
)
LFM2 = ToolSyntax(  # LFM2, LFM2.5
    "lfm2",
    PythonicShape(),
    ("List of tools: ",),
    call_open="<|tool_call_start|>",
    call_close="<|tool_call_end|>",
)
HARMONY = ToolSyntax(  # gpt-oss: its template renders one call per assistant message
    "harmony", HarmonyShape(), ("<|channel|>",), call_open="to=functions.", stops=("<|call|>",), parallel=False
)

# detection order: specific markers first (llama-server's specialised handlers come first as well)
FAMILIES: tuple[ToolSyntax, ...] = (
    KIMI_K3,
    MUSE_GLIMMER,
    HARMONY,
    KIMI_K2,
    DEEPSEEK_V3_2,
    DEEPSEEK_V4,
    MINICPM5,
    SEED_OSS,
    MINIMAX_M3,
    MINIMAX_M2,
    HY3,
    QWEN3_CODER,
    GLM,
    MISTRAL_SMALL,
    MISTRAL_ARGS,
    MISTRAL_NEMO,
    DEEPSEEK_R1,
    DEEPSEEK_V3_1,
    SOLAR_OPEN,
    COMMAND_R7B,
    COMMAND_R_PLUS,
    APRIEL,
    MINIMAX_M1,
    NEMOTRON_V2,
    GRANITE,
    APERTUS,
    FIREFUNCTION_V2,
    GIGACHAT3,
    GIGACHAT3_1,
    GEMMA4,
    LFM2,
    FUNCTIONARY_V3_2,
    FUNCTIONARY_V3_1,
    HERMES,
)


def detect_syntax(source: str) -> ToolSyntax | None:
    """The first family whose markers all occur in `source` (None: no native syntax known)."""
    return next((s for s in FAMILIES if s.matches(source)), None)


def by_name(name: str) -> ToolSyntax:
    """The family called `name` (KeyError if none)."""
    for syntax in FAMILIES:
        if syntax.name == name:
            return syntax
    raise KeyError(name)
