"""Native tool-call syntaxes as data: one `ToolSyntax` (runtime.tools.tool_syntax, which says what the fields
mean by shape) per family, and `detect_syntax` for a template. `FAMILIES` is in detection order (specific
first), as llama-server's `common_chat_try_specialized_template`. Adding a family is one entry here.
"""

from __future__ import annotations

from runtime.tools.tool_syntax import ToolSyntax

__all__ = ["FAMILIES", "ToolSyntax", "by_name", "detect_syntax"]

KIMI_K3 = ToolSyntax(  # XTML tags from <|open|> / <|close|> / <|sep|>; a parameter's type is an attribute
    "kimi_k3",
    "xml",
    ("<|open|>", "<|close|>", "<|end_of_msg|>"),
    section_open="<|open|>tools<|sep|>",
    section_close="<|close|>tools<|sep|>",
    fn_open='<|open|>call tool="',
    fn_name_end='"',
    fn_head_end="<|sep|>",
    fn_close="<|close|>call<|sep|>",
    param_open='<|open|>argument key="',
    param_name_end="<|sep|>",
    param_close="<|close|>argument<|sep|>",
    param_typed=('" type="string"', '" type="number"'),
    stops=("<|close|>message<|sep|>",),  # the message's end: the model writes <|end_of_msg|> next
)
MUSE_GLIMMER = ToolSyntax(  # `<|start|>assistant to=NAME<|message|>` then ATEM markup, one call per message
    "muse_glimmer",
    "xml",
    ("<atem:function_calls>", "<|eom|>"),
    call_open="<|message|><atem:function_calls>",
    call_close="</atem:function_calls>",
    fn_open='<atem:invoke name="',
    fn_name_end='">',
    fn_close="</atem:invoke>",
    param_open='<atem:parameter name="',
    param_name_end='">',
    param_close="</atem:parameter>",
    head=r"(?:<\|eom\|>)?\s*(?:<\|start\|>assistant)?\s*to=[^<\s]*\s*$",
    head_start=" to=",
    head_gbnf='( ( "<|eom|>" "<|start|>assistant" )? " "? "to=" [^<]* )?',
)
HERMES = ToolSyntax(  # {"name": in the template, or {\"name\": inside a string
    "hermes", "json", ("<tool_call>",), call_open="<tool_call>", call_close="</tool_call>", pattern=r'\{\\?"name\\?":'
)

QWEN3_CODER = ToolSyntax(  # Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, StepFun 3.5
    "qwen3_coder",
    "xml",
    ("<tool_call>", "<function=", "<parameter="),
    call_open="<tool_call>",
    call_close="</tool_call>",
    bare_open="<function=",
    value_newlines=True,
    fn_open="<function=",
    fn_name_end=">",
    fn_close="</function>",
    param_open="<parameter=",
    param_name_end=">",
    param_close="</parameter>",
)
SEED_OSS = ToolSyntax(
    "seed_oss",
    "xml",
    ("<seed:tool_call>",),
    call_open="<seed:tool_call>",
    call_close="</seed:tool_call>",
    fn_open="<function=",
    fn_name_end=">",
    fn_close="</function>",
    param_open="<parameter=",
    param_name_end=">",
    param_close="</parameter>",
)
GLM = ToolSyntax(  # GLM 4.5 / 4.6 / 4.7, Ling 3.0
    "glm",
    "xml",
    ("<tool_call>", "<arg_key>"),
    call_open="<tool_call>",
    call_close="</tool_call>",
    param_open="<arg_key>",
    param_name_end="</arg_key>",
    value_open="<arg_value>",
    param_close="</arg_value>",
)
HY3 = ToolSyntax(  # Tencent Hunyuan 3
    "hy3",
    "xml",
    ("'<tool_call{}>'.format(HYTK)", "':opensource'"),
    section_open="<tool_calls:opensource>",
    section_close="</tool_calls:opensource>",
    call_open="<tool_call:opensource>",
    call_close="</tool_call:opensource>",
    fn_name_end="<tool_sep:opensource>",
    param_open="<arg_key:opensource>",
    param_name_end="</arg_key:opensource>",
    value_open="<arg_value:opensource>",
    param_close="</arg_value:opensource>",
)
MINIMAX_M2 = ToolSyntax(
    "minimax_m2",
    "xml",
    ("<minimax:tool_call>", "<invoke name="),
    section_open="<minimax:tool_call>",
    section_close="</minimax:tool_call>",
    fn_open='<invoke name="',
    fn_name_end='">',
    fn_close="</invoke>",
    param_open='<parameter name="',
    param_name_end='">',
    param_close="</parameter>",
    exclude=("]<]minimax[>[",),
)
_MM = "]<]minimax[>["
MINIMAX_M3 = ToolSyntax(  # every tag after the `]<]minimax[>[` namespace token, a parameter's tag is its key
    "minimax_m3",
    "xml",
    (_MM, "<invoke name="),
    section_open=_MM + "<tool_call>",
    section_close=_MM + "</tool_call>",
    fn_open=_MM + '<invoke name="',
    fn_name_end='">',
    fn_close=_MM + "</invoke>",
    param_open=_MM + "<",
    param_name_end=">",
    param_close=_MM + "</",
    param_close_named=True,
)
DEEPSEEK_V3_2 = ToolSyntax(  # DeepSeek V3.2 (DSML)
    "deepseek_v3_2",
    "xml",
    ("dsml_token", "function_calls"),
    section_open="<｜DSML｜function_calls>",
    section_close="</｜DSML｜function_calls>",
    fn_open='<｜DSML｜invoke name="',
    fn_name_end='">',
    fn_close="</｜DSML｜invoke>",
    param_open='<｜DSML｜parameter name="',
    param_name_end='">',
    param_close="</｜DSML｜parameter>",
    param_typed=('" string="true', '" string="false'),
)
DEEPSEEK_V4 = ToolSyntax(  # DeepSeek V4 (DSML, `tool_calls` blocks)
    "deepseek_v4",
    "xml",
    ("dsml_token", "tool_calls>"),
    section_open="<｜DSML｜tool_calls>",
    section_close="</｜DSML｜tool_calls>",
    fn_open='<｜DSML｜invoke name="',
    fn_name_end='">',
    fn_close="</｜DSML｜invoke>",
    param_open='<｜DSML｜parameter name="',
    param_name_end='">',
    param_close="</｜DSML｜parameter>",
    param_typed=('" string="true', '" string="false'),
    exclude=("function_calls",),
)
MINICPM5 = ToolSyntax(
    "minicpm5",
    "xml",
    ("Tool usage guidelines:", '<function name="', '<param name="'),
    call_open='<function name="',
    fn_name_end='">',
    call_close="</function>",
    param_open='<param name="',
    param_name_end='">',
    param_close="</param>",
)
MISTRAL_SMALL = ToolSyntax(  # Mistral Small 3.2: ids in [CALL_ID]
    "mistral_small",
    "name_json",
    ("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"),
    call_open="[TOOL_CALLS]",
    id_open="[CALL_ID]",
    name_close="[ARGS]",
    id_style="mistral",
)
MISTRAL_ARGS = ToolSyntax(  # Devstral, Magistral, Ministral 3
    "mistral_args",
    "name_json",
    ("[TOOL_CALLS]", "[ARGS]"),
    call_open="[TOOL_CALLS]",
    name_close="[ARGS]",
    id_style="mistral",
)
MISTRAL_NEMO = ToolSyntax(
    "mistral_nemo",
    "json",
    ("[TOOL_CALLS]",),
    call_open="[TOOL_CALLS]",
    array=True,
    id_key="id",
    id_pattern="^[a-zA-Z0-9]{9}$",
    id_style="mistral",
)
KIMI_K2 = ToolSyntax(
    "kimi_k2",
    "name_json",
    ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
    section_open="<|tool_calls_section_begin|>",
    section_close="<|tool_calls_section_end|>",
    call_open="<|tool_call_begin|>",
    name_prefix="functions.",
    name_index=True,
    name_close="<|tool_call_argument_begin|>",
    call_close="<|tool_call_end|>",
    id_style="kimi",
)
DEEPSEEK_R1 = ToolSyntax(  # DeepSeek R1 and its distills: `function<｜tool▁sep｜>NAME` and a ```json fence
    "deepseek_r1",
    "name_json",
    ("<｜tool▁calls▁begin｜>", "```json"),
    section_open="<｜tool▁calls▁begin｜>",
    section_close="<｜tool▁calls▁end｜>",
    call_open="<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
    name_close="\n```json\n",
    args_close="```",
    call_close="<｜tool▁call▁end｜>",
)
DEEPSEEK_V3_1 = ToolSyntax(
    "deepseek_v3_1",
    "name_json",
    ("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"),
    section_open="<｜tool▁calls▁begin｜>",
    section_close="<｜tool▁calls▁end｜>",
    call_open="<｜tool▁call▁begin｜>",
    name_close="<｜tool▁sep｜>",
    call_close="<｜tool▁call▁end｜>",
)
SOLAR_OPEN = ToolSyntax(
    "solar_open",
    "name_json",
    ("<|tool_call:begin|>", "<|tool_call:name|>"),
    section_open="<|tool_calls|>",
    section_close="<|calls|>",
    call_open="<|tool_call:begin|>",
    id_before="<|tool_call:name|>",
    name_close="<|tool_call:args|>",
    call_close="<|tool_call:end|>",
)
FUNCTIONARY_V3_1 = ToolSyntax(  # also a Llama 3.1 template: checked before Llama 3.x
    "functionary_v3_1",
    "name_json",
    ("<function=",),
    call_open="<function=",
    name_close=">",
    call_close="</function>",
    stops=("<|eom_id|>",),
)
COMMAND_R7B = ToolSyntax(  # Command R7B, Cohere2 MoE
    "command_r7b",
    "json",
    ("<|START_ACTION|>",),
    call_open="<|START_ACTION|>",
    call_close="<|END_ACTION|>",
    array=True,
    name_key="tool_name",
    args_key="parameters",
    id_key="tool_call_id",
    id_first=True,
)
COMMAND_R_PLUS = ToolSyntax(  # Action: and a ```json fence around the list
    "command_r_plus",
    "json",
    ("Action:", "<|CHATBOT_TOKEN|>"),
    call_open="Action:",
    args_open="```json",
    args_close="```",
    array=True,
    name_key="tool_name",
    args_key="parameters",
    exclude=("<|START_ACTION|>",),
)
APRIEL = ToolSyntax(  # Apriel 1.5 / 1.6
    "apriel",
    "json",
    ("<tool_calls>[",),
    call_open="<tool_calls>",
    call_close="</tool_calls>",
    array=True,
    id_key="id",
)
MINIMAX_M1 = ToolSyntax(
    "minimax_m1",
    "json",
    ("<tool_calls>", "<beginning_of_sentence>"),
    section_open="<tool_calls>",
    section_close="</tool_calls>",
)
NEMOTRON_V2 = ToolSyntax(
    "nemotron_v2", "json", ("<TOOLCALL>",), call_open="<TOOLCALL>", call_close="</TOOLCALL>", array=True
)
GRANITE = ToolSyntax("granite", "json", ("<|tool_call|>",), call_open="<|tool_call|>", array=True)
APERTUS = ToolSyntax(
    "apertus",
    "json",
    ("<|tools_prefix|>",),
    call_open="<|tools_prefix|>",
    call_close="<|tools_suffix|>",
    array=True,
    name_is_key=True,
)
FIREFUNCTION_V2 = ToolSyntax(
    "firefunction_v2", "json", ("functools[",), call_open="functools", array=True, tools_variable="functions"
)
FUNCTIONARY_V3_2 = ToolSyntax(
    "functionary_v3_2",
    "name_json",
    (">>>all", ">>>${recipient}"),
    call_open=">>>",
    name_close="\n",
    content_recipient="all",
)
GIGACHAT3 = ToolSyntax(  # one call, as a message of its own after the content
    "gigachat3",
    "json",
    ("<|role_sep|>", "<|message_sep|>", "function call"),
    call_open="<|message_sep|>\n\nfunction call<|role_sep|>",
    parallel=False,
    exclude=("<|function_call|>",),
)
GIGACHAT3_1 = ToolSyntax(
    "gigachat3_1", "json", ("<|role_sep|>", "<|function_call|>"), call_open="<|function_call|>", parallel=False
)
GEMMA4 = ToolSyntax(  # the template writes `<|tool_response>` after the calls: the model stops there for the results
    "gemma4",
    "gemma",
    ("'<|tool_call>call:'",),
    call_open="<|tool_call>call:",
    call_close="<tool_call|>",
    stops=("<|tool_response>",),
)
LFM2 = ToolSyntax(  # LFM2, LFM2.5
    "lfm2",
    "pythonic",
    ("List of tools: ",),
    call_open="<|tool_call_start|>",
    call_close="<|tool_call_end|>",
)
HARMONY = ToolSyntax(  # gpt-oss: its template renders one call per assistant message
    "harmony", "harmony", ("<|channel|>",), call_open="to=functions.", stops=("<|call|>",), parallel=False
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
