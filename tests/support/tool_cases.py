"""Tool-call parse cases as data: per family, a real template, the model's raw output, the expected message.

Taken from llama.cpp's `tests/test-chat.cpp` (the vendored tree of llama-cpp-python 0.3.36; the line of each
case there is in `Case.source`), written again here as data: the same outputs and the same expectations
(content, reasoning, tool calls with their arguments and, where the syntax carries one, the id). Cases marked
`source="own"` are ours: families test-chat.cpp has no call case for (Qwen3, Llama 3.x) and the malformed
outputs, where a finished reply must give a typed `ToolCallParseError` (or, where said, plain text), never a
crash.

`output` is what the model generates after the generation prompt (rendered with `thinking` as
`enable_thinking`), exactly as test-chat.cpp feeds its parser. Reasoning is split as the Runtime splits it
(llama-server's `--reasoning-format auto`); test-chat.cpp's expectations with `reasoning_format none` are
not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CASES", "TOOLS", "Call", "Case", "tool_defs"]


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


_INT = {"type": "integer", "description": "The arg."}
TOOLS: dict[str, dict[str, Any]] = {
    "special_function": _fn("special_function", "I'm special", {"arg1": _INT}, ["arg1"]),
    "special_function_with_opt": _fn(
        "special_function_with_opt",
        "I'm special but have optional stuff",
        {"arg1": _INT, "arg2": {"type": "integer", "description": "The optional arg."}},
        ["arg1"],
    ),
    "python": _fn("python", "an ipython interpreter", {"code": {"type": "string"}}, ["code"]),
    "get_time": _fn("get_time", "Get the current time in a city", {"city": {"type": "string"}}, ["city"]),
    "get_weather": _fn("get_weather", "Get the current weather in a city", {"city": {"type": "string"}}, ["city"]),
    "empty_args": {
        "type": "function",
        "function": {
            "name": "empty_args",
            "description": "A tool that takes no arguments",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    "edit": _fn(
        "edit",
        "Edit a file",
        {"oldString": {"type": "string"}, "newString": {"type": "string"}, "replaceAll": {"type": "boolean"}},
        ["oldString", "newString"],
    ),
}


def tool_defs(names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The OpenAI tool dicts called `names`."""
    return [TOOLS[n] for n in names]


@dataclass(frozen=True)
class Call:
    """An expected tool call: its name, its arguments, and its id when the syntax writes one."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class Case:
    """One model output in one template's syntax and the message it parses to.

    `error`: a finished reply that must raise `ToolCallParseError` (streaming it must still never raise).
    `parallel`: the request allows parallel calls. `thinking`: `enable_thinking` for the render (None: the
    template's default). `reconstruct`: test-chat.cpp checks that the template renders the parsed message
    back into exactly the generated text.
    """

    name: str
    template: str
    output: str
    tools: tuple[str, ...] = ("special_function",)
    content: str = ""
    reasoning: str = ""
    calls: tuple[Call, ...] = ()
    thinking: bool | None = None
    parallel: bool = False
    error: bool = False
    reconstruct: bool = False
    source: str = "own"
    notes: str = field(default="", compare=False)


ARG1 = {"arg1": 1}
CALL = (Call("special_function", ARG1),)
TWO = (Call("special_function", ARG1), Call("special_function_with_opt", {"arg1": 1, "arg2": 2}))
BOTH = ("special_function", "special_function_with_opt")
HELLO = "Hello, world!\nWhat's up?"
THINKING = "I'm\nthinking"

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
HERMES2 = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"
HERMES3 = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
CODER = "Qwen3-Coder.jinja"
QWEN35 = "Qwen3.5-4B.jinja"
NEMOTRON3 = "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja"
SMALL32 = "Mistral-Small-3.2-24B-Instruct-2506.jinja"
DEVSTRAL = "unsloth-mistral-Devstral-Small-2507.jinja"
MINISTRAL = "mistralai-Ministral-3-14B-Reasoning-2512.jinja"
NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
GPTOSS = "openai-gpt-oss-120b.jinja"
V31 = "deepseek-ai-DeepSeek-V3.1.jinja"
R1 = "llama-cpp-deepseek-r1.jinja"
R1QWEN = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
LLAMA32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
GLM46 = "GLM-4.6.jinja"
GLM47 = "GLM-4.7-Flash.jinja"
KIMI = "moonshotai-Kimi-K2.jinja"
KIMI_INSTRUCT = "Kimi-K2-Instruct.jinja"
MINIMAX = "MiniMax-M2.jinja"
R7B = "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"
SEED = "ByteDance-Seed-OSS.jinja"
NANO2 = "NVIDIA-Nemotron-Nano-v2.jinja"
APERTUS = "Apertus-8B-Instruct.jinja"
LFM25 = "LFM2.5-8B-A1B.jinja"
FUNC31 = "meetkai-functionary-medium-v3.1.jinja"
FUNC32 = "meetkai-functionary-medium-v3.2.jinja"
FIREFUNCTION = "fireworks-ai-llama-3-firefunction-v2.jinja"
APRIEL15 = "unsloth-Apriel-1.5.jinja"
GIGACHAT = "GigaChat3-10B-A1.8B.jinja"
GEMMA4 = "google-gemma-4-31B-it.jinja"
MUSE = "muse-glimmer.jinja"
KIMI3 = "Kimi-K3.jinja"
RPLUS = "CohereForAI-c4ai-command-r-plus-tool_use.jinja"
V32 = "deepseek-ai-DeepSeek-V3.2.jinja"
MINIMAX3 = "MiniMax-M3.jinja"
GRANITE4 = "ibm-granite-granite-4.0.jinja"

_CODER_CALL = "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>"
_CODER_OPT = (
    "<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n"
    "<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>"
)
_DS = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"  # DeepSeek's full-width bars and low lines
_DS_END = "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"

CASES: tuple[Case, ...] = (
    # --- Hermes-style <tool_call> JSON (Qwen 2.5, Hermes 2 Pro / 3, Qwen3 with reasoning) ---------------------
    Case(
        "hermes2-call",
        HERMES2,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        calls=CALL,
        source="test-chat.cpp:3332",
    ),
    Case(
        "hermes2-content-call",
        HERMES2,
        HELLO + '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        content=HELLO,
        calls=CALL,
        source="test-chat.cpp:3340",
    ),
    Case("qwen25-text", QWEN25, HELLO, content=HELLO, reconstruct=True, source="test-chat.cpp:6106"),
    Case(
        "qwen25-call",
        QWEN25,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:6107",
    ),
    Case(
        "hermes3-call",
        HERMES3,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:6107",
    ),
    Case(
        "qwen3-reasoning-call",
        QWEN3,
        '<think>\nI\'m\nthinking\n</think>\n\n<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}'
        "\n</tool_call>",
        reasoning=THINKING,
        calls=CALL,
        thinking=True,
    ),
    Case(
        "qwen3-parallel",
        QWEN3,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "special_function_with_opt", "arguments": {"arg1": 1, "arg2": 2}}\n</tool_call>',
        tools=BOTH,
        calls=TWO,
        parallel=True,
        thinking=False,
    ),
    Case(
        "qwen3-unknown-tool",
        QWEN3,
        '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',
        error=True,
        thinking=False,
    ),
    Case(
        "qwen3-bad-arguments",
        QWEN3,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": "one"}}\n</tool_call>',
        error=True,
        thinking=False,
    ),
    Case(
        "qwen3-cut-json",
        QWEN3,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": ',
        error=True,
        thinking=False,
    ),
    Case("qwen3-stray-close", QWEN3, "All done.</tool_call>", error=True, thinking=False),
    # --- <function=…><parameter=…> XML (Qwen3-Coder, Qwen3.5, Nemotron 3) -------------------------------------
    Case("coder-text", CODER, HELLO, content=HELLO, reconstruct=True, source="test-chat.cpp:3554"),
    Case("coder-call", CODER, _CODER_CALL, calls=CALL, reconstruct=True, source="test-chat.cpp:3556"),
    Case(
        "coder-no-opener",
        CODER,
        "<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        calls=CALL,
        source="test-chat.cpp:3570",
    ),
    Case(
        "coder-content-no-opener",
        CODER,
        "Let me call it.\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        content="Let me call it.\n",
        calls=CALL,
        source="test-chat.cpp:3581",
    ),
    Case(
        "coder-parallel",
        CODER,
        _CODER_CALL + "\n" + _CODER_OPT,
        tools=BOTH,
        calls=TWO,
        parallel=True,
        reconstruct=True,
        source="test-chat.cpp:3616",
    ),
    Case(
        "coder-python-lines",
        CODER,
        '<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n    print("Hello, world!")\n\nhello()\n'
        "</parameter>\n</function>\n</tool_call>",
        tools=("python",),
        calls=(Call("python", {"code": 'def hello():\n    print("Hello, world!")\n\nhello()'}),),
        reconstruct=True,
        source="test-chat.cpp:3643",
    ),
    Case(
        "coder-unicode",
        CODER,
        "<tool_call>\n<function=python>\n<parameter=code>\n格\n</parameter>\n</function>\n</tool_call>",
        tools=("python",),
        calls=(Call("python", {"code": "格"}),),
        reconstruct=True,
        source="test-chat.cpp:3663",
    ),
    Case(
        "coder-unknown-tool",
        CODER,
        "<tool_call>\n<function=nope>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        error=True,
    ),
    Case("qwen35-call", QWEN35, _CODER_CALL, calls=CALL, thinking=False, source="test-chat.cpp:2162"),
    Case(
        "qwen35-reasoning-call",
        QWEN35,
        "I'm\nthinking\n</think>\n\n" + _CODER_CALL,
        reasoning=THINKING,
        calls=CALL,
        source="test-chat.cpp:2174",
    ),
    Case(
        "qwen35-parallel",
        QWEN35,
        _CODER_CALL + "\n" + _CODER_OPT,
        tools=BOTH,
        calls=TWO,
        parallel=True,
        thinking=False,
        source="test-chat.cpp:2186",
    ),
    Case(
        "nemotron3-reasoning-call",
        NEMOTRON3,
        "I'm\nthinking\n</think>\n" + _CODER_CALL + "\n",
        reasoning=THINKING,
        calls=CALL,
        source="test-chat.cpp:2731",
    ),
    # --- Mistral [TOOL_CALLS] (Nemo: a JSON list; Small 3.2 / Devstral / Ministral 3: name[ARGS]{…}) ----------
    Case("nemo-text", NEMO, HELLO, content=HELLO, reconstruct=True, source="test-chat.cpp:5916"),
    Case(
        "nemo-call",
        NEMO,
        '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
        calls=(Call("special_function", ARG1, "123456789"),),
        reconstruct=True,
        source="test-chat.cpp:5917",
    ),
    Case("small32-text", SMALL32, HELLO, content=HELLO, reconstruct=True, source="test-chat.cpp:6253"),
    Case(
        "small32-call",
        SMALL32,
        '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}',
        calls=(Call("special_function", ARG1, "123456789"),),
        reconstruct=True,
        source="test-chat.cpp:6254",
    ),
    Case(
        "small32-parallel",
        SMALL32,
        '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
        '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
        tools=BOTH,
        calls=(
            Call("special_function", ARG1, "000000001"),
            Call("special_function_with_opt", {"arg1": 1, "arg2": 2}, "000000002"),
        ),
        parallel=True,
        reconstruct=True,
        source="test-chat.cpp:6260",
    ),
    Case("small32-unknown-tool", SMALL32, '[TOOL_CALLS]nope[CALL_ID]123456789[ARGS]{"arg1": 1}', error=True),
    Case("small32-cut-args", SMALL32, '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": ', error=True),
    Case(
        "devstral-call",
        DEVSTRAL,
        '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}',
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:6285",
    ),
    Case(
        "devstral-content-call",
        DEVSTRAL,
        HELLO + '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}',
        content=HELLO,
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:6290",
    ),
    Case(
        "ministral3-call",
        MINISTRAL,
        '[TOOL_CALLS]special_function[ARGS]{"arg1":1}',
        calls=CALL,
        thinking=True,
        source="test-chat.cpp:2618",
    ),
    Case(
        "ministral3-reasoning-call",
        MINISTRAL,
        '[THINK]I\'m\nthinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1":1}',
        reasoning=THINKING,
        calls=CALL,
        thinking=True,
        source="test-chat.cpp:2625",
    ),
    Case(
        "ministral3-parallel",
        MINISTRAL,
        '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}[TOOL_CALLS]special_function_with_opt[ARGS]'
        '{"arg1": 1, "arg2": 2}',
        tools=BOTH,
        calls=TWO,
        parallel=True,
        reconstruct=True,
        source="test-chat.cpp:2634",
    ),
    Case(
        "ministral3-marker-in-reasoning",
        MINISTRAL,
        '[THINK]Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more[/THINK]'
        '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}',
        reasoning='Let me think about [TOOL_CALLS]special_function[ARGS]{"arg1":1} and more',
        calls=CALL,
        thinking=True,
        reconstruct=True,
        source="test-chat.cpp:2660",
    ),
    # --- gpt-oss harmony: recipients in the role or the channel header ----------------------------------------
    Case("gptoss-final", GPTOSS, "<|channel|>final<|message|>" + HELLO, content=HELLO, source="test-chat.cpp:6428"),
    Case(
        "gptoss-reasoning-final",
        GPTOSS,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>" + HELLO,
        content=HELLO,
        reasoning=THINKING,
        source="test-chat.cpp:6434",
    ),
    Case(
        "gptoss-role-recipient",
        GPTOSS,
        ' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}',
        calls=CALL,
        source="test-chat.cpp:6457",
    ),
    Case(
        "gptoss-channel-recipient",
        GPTOSS,
        '<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}',
        calls=CALL,
        source="test-chat.cpp:6464",
    ),
    Case(
        "gptoss-constrain",
        GPTOSS,
        ' to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{"arg1": 1}',
        calls=CALL,
        source="test-chat.cpp:6471",
    ),
    Case(
        "gptoss-commentary",
        GPTOSS,
        '<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}',
        calls=CALL,
        source="test-chat.cpp:6478",
    ),
    Case(
        "gptoss-reasoning-call",
        GPTOSS,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function"
        '<|channel|>analysis<|message|>{"arg1": 1}',
        reasoning=THINKING,
        calls=CALL,
        source="test-chat.cpp:6485",
    ),
    Case(
        "gptoss-edit",
        GPTOSS,
        "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.edit <|constrain|>json<|message|>{"oldString": "if (part < railCount - 1) {", "newString": '
        '"if (part < 4) {", "replaceAll": false}',
        tools=("edit",),
        reasoning="Thinking about edit...",
        calls=(
            Call(
                "edit",
                {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": False},
            ),
        ),
        source="test-chat.cpp:6494",
    ),
    Case(
        "gptoss-builtin-recipient",
        GPTOSS,
        "<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant to=container.exec"
        "<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
        reasoning="I will execute python to say hello",
        source="test-chat.cpp:6539",
        notes="an unsolicited builtin call: llama-server returns empty content and no call",
    ),
    Case("gptoss-unknown-tool", GPTOSS, '<|channel|>commentary to=functions.nope<|message|>{"arg1": 1}', error=True),
    # --- DeepSeek R1 / V3.1 ----------------------------------------------------------------------------------
    Case(
        "v31-call",
        V31,
        _DS + 'get_time<｜tool▁sep｜>{"city": "XYZCITY"}' + _DS_END,
        tools=("get_time",),
        calls=(Call("get_time", {"city": "XYZCITY"}),),
        thinking=False,
        source="test-chat.cpp:3920",
    ),
    Case(
        "v31-reasoning-call",
        V31,
        "REASONING</think>" + _DS + 'get_time<｜tool▁sep｜>{"city": "Tokyo"}' + _DS_END,
        tools=("get_time",),
        reasoning="REASONING",
        calls=(Call("get_time", {"city": "Tokyo"}),),
        thinking=True,
        source="test-chat.cpp:3953",
    ),
    Case(
        "v31-reasoning-content-parallel",
        V31,
        "REASONING</think>CONTENT" + _DS + 'get_time<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}' + _DS_END,
        tools=("get_time", "get_weather"),
        reasoning="REASONING",
        content="CONTENT",
        calls=(Call("get_time", {"city": "Paris"}), Call("get_weather", {"city": "Paris"})),
        thinking=True,
        parallel=True,
        source="test-chat.cpp:3965",
    ),
    Case(
        "v31-unknown-tool",
        V31,
        _DS + 'nope<｜tool▁sep｜>{"city": "X"}' + _DS_END,
        tools=("get_time",),
        error=True,
        thinking=False,
    ),
    Case(
        "r1-call",
        R1,
        "</think>" + _DS + 'function<｜tool▁sep｜>special_function\n```json\n{"arg1": 1}```' + _DS_END,
        calls=CALL,
        parallel=True,
        source="test-chat.cpp:6028",
    ),
    Case(
        "r1qwen-call",
        R1QWEN,
        _DS + 'function<｜tool▁sep｜>special_function\n```json\n{"arg1": 1}```' + _DS_END,
        calls=CALL,
        thinking=False,
        source="test-chat.cpp:6071",
    ),
    # --- Llama 3.x JSON (llama-server's Llama 3.x handling; test-chat.cpp keeps only content cases) ----------
    Case("llama31-text", LLAMA31, HELLO, content=HELLO, reconstruct=True, source="test-chat.cpp:6300"),
    Case("llama31-call", LLAMA31, '{"name": "special_function", "parameters": {"arg1": 1}}', calls=CALL),
    Case(
        "llama31-typed-call",
        LLAMA31,
        '{"type": "function", "name": "special_function", "parameters": {"arg1": 1}}',
        calls=CALL,
    ),
    Case("llama32-call", LLAMA32, '{"name": "special_function", "parameters": {"arg1": 1}}', calls=CALL),
    Case("llama31-unknown-tool", LLAMA31, '{"name": "nope", "parameters": {"arg1": 1}}', error=True),
    # --- GLM 4.6 / 4.7 <arg_key>/<arg_value> ------------------------------------------------------------------
    Case(
        "glm46-call",
        GLM46,
        "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        calls=CALL,
        source="test-chat.cpp:4389",
    ),
    Case(
        "glm47-call",
        GLM47,
        "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>",
        calls=CALL,
        thinking=False,
        reconstruct=True,
        source="test-chat.cpp:4423",
    ),
    Case(
        "glm47-reasoning-call",
        GLM47,
        "I'm\nthinking</think><tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>",
        reasoning=THINKING,
        calls=CALL,
        thinking=True,
        source="test-chat.cpp:4432",
    ),
    # --- Kimi K2: functions.NAME:IDX ids ----------------------------------------------------------------------
    Case(
        "kimi-call",
        KIMI,
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0"
        '<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|><|tool_calls_section_end|>',
        calls=(Call("special_function", ARG1, "functions.special_function:0"),),
        reconstruct=True,
        source="test-chat.cpp:5186",
    ),
    Case(
        "kimi-instruct-call",
        KIMI_INSTRUCT,
        "<|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.special_function:0<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        calls=(Call("special_function", ARG1, "functions.special_function:0"),),
        reconstruct=True,
        source="test-chat.cpp:5197",
    ),
    # --- MiniMax M2 <invoke name=…> ---------------------------------------------------------------------------
    Case(
        "minimax-empty-args",
        MINIMAX,
        'Let\'s call a tool:\n</think>\n\n<minimax:tool_call>\n<invoke name="empty_args">'
        "\n</invoke>\n</minimax:tool_call>",
        tools=("empty_args",),
        reasoning="Let's call a tool:",
        calls=(Call("empty_args", {}),),
        thinking=True,
        source="test-chat.cpp:5448",
    ),
    Case(
        "minimax-call",
        MINIMAX,
        '\n</think>\n\n<minimax:tool_call>\n<invoke name="special_function">\n<parameter '
        'name="arg1">1</parameter>\n</invoke>\n</minimax:tool_call>',
        calls=CALL,
        source="test-chat.cpp:5455",
    ),
    # --- Command R7B <|START_ACTION|>[…] ----------------------------------------------------------------------
    Case(
        "r7b-reasoning-call",
        R7B,
        "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n]<|END_ACTION|>',
        reasoning=THINKING,
        calls=(Call("special_function", ARG1, "0"),),
        source="test-chat.cpp:2838",
    ),
    Case(
        "r7b-call",
        R7B,
        "<|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n]<|END_ACTION|>',
        calls=(Call("special_function", ARG1, "0"),),
        source="test-chat.cpp:2858",
    ),
    # --- Seed-OSS <seed:tool_call> ------------------------------------------------------------------------------
    Case(
        "seed-call",
        SEED,
        "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n</function>\n</seed:tool_call>",
        calls=CALL,
        source="test-chat.cpp:3453",
    ),
    Case(
        "seed-parallel",
        SEED,
        "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n"
        "</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=special_function_with_opt>\n"
        "<parameter=arg1>1</parameter>\n<parameter=arg2>2</parameter>\n</function>\n</seed:tool_call>",
        tools=BOTH,
        calls=TWO,
        parallel=True,
        source="test-chat.cpp:3463",
    ),
    # --- the rest of llama-server's native families -----------------------------------------------------------
    Case(
        "nano2-reasoning-call",
        NANO2,
        'I\'m\nthinking\n</think>\n<TOOLCALL>[{"name": "special_function", "arguments": {"arg1": 1}}]</TOOLCALL>',
        reasoning=THINKING,
        calls=CALL,
        source="test-chat.cpp:5852",
    ),
    Case(
        "apertus-call",
        APERTUS,
        '<|tools_prefix|>[{"special_function": {"arg1": 1}}]<|tools_suffix|>',
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:5424",
    ),
    Case(
        "lfm25-reasoning-call",
        LFM25,
        "<think>I'm\nthinking</think><|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>",
        reasoning=THINKING,
        calls=CALL,
        source="test-chat.cpp:5242",
    ),
    Case(
        "lfm25-reasoning-content-call",
        LFM25,
        "<think>I need to call a function</think>Let me check the time."
        '<|tool_call_start|>[get_time(city="Paris")]<|tool_call_end|>',
        tools=("get_time",),
        reasoning="I need to call a function",
        content="Let me check the time.",
        calls=(Call("get_time", {"city": "Paris"}),),
        source="test-chat.cpp:5249",
    ),
    Case(
        "functionary31-call",
        FUNC31,
        '<function=special_function>{"arg1": 1}</function>',
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:5934",
    ),
    Case("functionary32-text", FUNC32, "all\n" + HELLO, content=HELLO, reconstruct=True, source="test-chat.cpp:5951"),
    Case(
        "functionary32-call",
        FUNC32,
        'special_function\n{"arg1": 1}',
        calls=CALL,
        source="test-chat.cpp:5952",
        notes="no reconstruction here (test-chat.cpp expects it): the template writes the arguments as text and a"
        ' session keeps them as an object, rendered back compactly as llama-server dumps one ({"arg1":1});'
        " llama-server keeps the model's own text",
    ),
    Case(
        "firefunction-call",
        FIREFUNCTION,
        ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]',
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:5971",
    ),
    Case(
        "apriel15-call",
        APRIEL15,
        '<tool_calls>[{"name": "special_function", "arguments": {"arg1": 1}}]</tool_calls>',
        calls=CALL,
        source="test-chat.cpp:6192",
    ),
    Case(
        "gigachat-call",
        GIGACHAT,
        '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "special_function", "arguments": {"arg1": 1}}',
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:6818",
    ),
    Case(
        "gigachat-content-call",
        GIGACHAT,
        HELLO + '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "special_function", "arguments": {"arg1": 1}}',
        content=HELLO,
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:6825",
    ),
    # --- more of llama-server's native families (test-chat.cpp) -------------------------------------------
    Case(
        "gemma4-call",
        GEMMA4,
        '<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|>',
        tools=("get_time",),
        calls=(Call("get_time", {"city": "London"}),),
        source="test-chat.cpp:3018",
    ),
    Case(
        "gemma4-empty-args",
        GEMMA4,
        "<|tool_call>call:empty_args{}<tool_call|>",
        tools=("empty_args",),
        calls=(Call("empty_args", {}),),
        source="test-chat.cpp:3032",
    ),
    Case(
        "gemma4-reasoning-text",
        GEMMA4,
        "<|channel>thought\nI'm\nthinking<channel|>" + HELLO,
        tools=("get_time",),
        content=HELLO,
        reasoning=THINKING,
        source="test-chat.cpp:2997",
    ),
    Case(
        "muse-call",
        MUSE,
        ' to=special_function<|message|><atem:function_calls>\n<atem:invoke name="special_function">\n'
        '<atem:parameter name="arg1">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>',
        calls=CALL,
        source="test-chat.cpp:6371",
    ),
    Case(
        "rplus-call",
        RPLUS,
        'Action:\n```json\n[{"tool_name": "special_function", "parameters": {"arg1": 1}}]\n```',
        calls=CALL,
        source="test-chat.cpp:5895",
    ),
    Case(
        "v32-reasoning-call",
        V32,
        'Let me check the time</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_time">\n'
        '<｜DSML｜parameter name="city" string="true">Tokyo</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜function_calls>",
        tools=("get_time",),
        reasoning="Let me check the time",
        calls=(Call("get_time", {"city": "Tokyo"}),),
        thinking=True,
        source="test-chat.cpp:4020",
    ),
    Case(
        "minimax3-reasoning-call",
        MINIMAX3,
        '<mm:think>Let me check the time</mm:think>]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_time">'
        "]<]minimax[>[<city>Tokyo]<]minimax[>[</city>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
        tools=("get_time",),
        reasoning="Let me check the time",
        calls=(Call("get_time", {"city": "Tokyo"}),),
        thinking=True,
        source="test-chat.cpp:5510",
    ),
    Case(
        "kimi3-call",
        KIMI3,
        "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="special_function" index="1"<|sep|>'
        '<|open|>argument key="arg1" type="number"<|sep|>1<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>",
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:4893",
        notes="test-chat.cpp's output starts at <|open|>response (an implicitly empty think section, which our"
        " reasoning split does not read yet) and ends with <|close|>message<|sep|> (the family's stop string); this is"
        " the template's own rendering of an empty think section",
    ),
    Case(
        "kimi3-reasoning-content-call",
        KIMI3,
        "I should call it<|close|>think<|sep|><|open|>response<|sep|>On it.<|close|>response<|sep|>"
        '<|open|>tools<|sep|><|open|>call tool="special_function" index="1"<|sep|>'
        '<|open|>argument key="arg1" type="number"<|sep|>1<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>",
        reasoning="I should call it",
        content="On it.",
        calls=CALL,
        reconstruct=True,
        source="test-chat.cpp:4905",
        notes="as kimi3-call: without the stop string",
    ),
    Case(
        "granite4-call",
        GRANITE4,
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        calls=CALL,
        source="test-chat.cpp:3411",
    ),
)
