"""The tool-call syntaxes as data (runtime.tools.families) and the one scanner / grammar built from them.

Per family: detection on the vendored template, the parse of a model output in the family's syntax (exact
content, calls and ids), the streaming invariant at every prefix, reconstruction through the template,
and the grammar in llama.cpp's sampler (the output accepted, a wrong tool refused, a call written inside
the reasoning never triggering it).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.errors import ToolCallParseError
from runtime.testing import ScriptedBackend
from runtime.tools import (
    FAMILIES,
    GenericFormat,
    PartialReply,
    SyntaxFormat,
    ToolChoice,
    ToolFormat,
    as_tools,
    call_id,
    canonical_arguments,
)
from runtime.tools import partial_json as pj
from runtime.tools.families import by_name
from runtime.tools.formats import detect_format
from runtime.tools.reconstruct import check
from sessions import MemoryStore
from tests.support.tool_models import write_qwen
from tests.support.vendor import vendored_template
from tests.tools.test_tools_grammar import Vocab

SPEC = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TOOLS = as_tools([SPEC])
AUTO, REQUIRED, NONE = ToolChoice("auto"), ToolChoice("required"), ToolChoice("none")
PARIS = {"city": "Paris", "days": 2}
OSLO = {"city": 'Oslo "N"\n', "days": 3}

# family -> (a vendored template of the family, one call to get_weather(PARIS) in its syntax, its content)
CASES: dict[str, tuple[str, str, str]] = {
    "hermes": (
        "Qwen-Qwen3-0.6B.jinja",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
        "Let me check.",
    ),
    "qwen3_coder": (
        "Qwen3-Coder.jinja",
        "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "Let me check.",
    ),
    "seed_oss": (
        "ByteDance-Seed-OSS.jinja",
        "Let me check.\n\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
        "<parameter=days>2</parameter>\n</function>\n</seed:tool_call>",
        "Let me check.",
    ),
    "glm": (
        "GLM-4.6.jinja",
        "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        "Let me check.",
    ),
    "hy3": (
        "tencent-Hy3.jinja",
        "Let me check.<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
        "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris</arg_value:opensource>\n"
        "<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>2</arg_value:opensource>\n"
        "</tool_call:opensource>\n</tool_calls:opensource>",
        "Let me check.",
    ),
    "minimax_m2": (
        "MiniMax-M2.jinja",
        'Let me check.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>',
        "Let me check.",
    ),
    "deepseek_v3_2": (
        "deepseek-ai-DeepSeek-V3.2.jinja",
        'Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜function_calls>",
        "Let me check.",
    ),
    "deepseek_v4": (
        "deepseek-ai-DeepSeek-V4.jinja",
        'Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls>",
        "Let me check.",
    ),
    "minicpm5": (
        "openbmb-MiniCPM5-1B.jinja",
        'Let me check.\n<function name="get_weather"><param name="city">Paris</param>'
        '<param name="days">2</param></function>',
        "Let me check.",
    ),
    "mistral_small": (
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        '[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{"city": "Paris", "days": 2}',
        "",
    ),
    "mistral_args": (
        "unsloth-mistral-Devstral-Small-2507.jinja",
        'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}',
        "Let me check.",
    ),
    "mistral_nemo": (
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "abcDEF123"}]',
        "",
    ),
    "kimi_k2": (
        "moonshotai-Kimi-K2.jinja",
        "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 2}<|tool_call_end|><|tool_calls_section_end|>',
        "Let me check.",
    ),
    "deepseek_r1": (
        "llama-cpp-deepseek-r1.jinja",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
    ),
    "deepseek_v3_1": (
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "days": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Let me check.",
    ),
    "solar_open": (
        "upstage-Solar-Open-100B.jinja",
        "<|tool_calls|><|tool_call:begin|>abcDEF123<|tool_call:name|>get_weather<|tool_call:args|>"
        '{"city": "Paris", "days": 2}<|tool_call:end|><|calls|>',
        "",
    ),
    "command_r7b": (
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": '
        '{"city": "Paris", "days": 2}}\n]<|END_ACTION|>',
        "",
    ),
    "command_r_plus": (
        "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
        'Action:\n```json\n[{"tool_name": "get_weather", "parameters": {"city": "Paris", "days": 2}}]\n```',
        "",
    ),
    "apriel": (
        "unsloth-Apriel-1.5.jinja",
        'Let me check.\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]</tool_calls>',
        "Let me check.",
    ),
    "minimax_m1": (
        "MiniMax-M1.jinja",
        '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_calls>',
        "",
    ),
    "nemotron_v2": (
        "NVIDIA-Nemotron-Nano-v2.jinja",
        'Let me check.\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]</TOOLCALL>',
        "Let me check.",
    ),
    "granite": (
        "ibm-granite-granite-3.3-2B-Instruct.jinja",
        'Let me check.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
        "Let me check.",
    ),
    "apertus": (
        "Apertus-8B-Instruct.jinja",
        'Let me check.<|tools_prefix|>[{"get_weather": {"city": "Paris", "days": 2}}]<|tools_suffix|>',
        "Let me check.",
    ),
    "firefunction_v2": (
        "fireworks-ai-llama-3-firefunction-v2.jinja",
        'Let me check. functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
        "Let me check.",
    ),
    "functionary_v3_1": (
        "meetkai-functionary-medium-v3.1.jinja",
        'Let me check.<function=get_weather>{"city": "Paris", "days": 2}</function>',
        "Let me check.",
    ),
    "functionary_v3_2": (  # after a generation prompt that ends with `>>>`
        "meetkai-functionary-medium-v3.2.jinja",
        'all\nLet me check.>>>get_weather\n{"city":"Paris","days":2}',  # compact, as its template writes
        "Let me check.",
    ),
    "gigachat3": (
        "GigaChat3-10B-A1.8B.jinja",
        'Let me check.<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "days": 2}}',
        "Let me check.",
    ),
    "gigachat3_1": (
        "GigaChat3.1-10B-A1.8B.jinja",
        'Let me check.<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}',
        "Let me check.",
    ),
    "gemma4": (
        "google-gemma-4-31B-it.jinja",
        'Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>',
        "Let me check.",
    ),
    "lfm2": (
        "LFM2.5-8B-A1B.jinja",
        "Let me check.<|tool_call_start|>[get_weather(city='Paris', days=2)]<|tool_call_end|>",
        "Let me check.",
    ),
    "kimi_k3": (  # the answer part, after the splitter took the think and response sections
        "Kimi-K3.jinja",
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        '<|open|>argument key="days" type="number"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|>'
        "<|close|>tools<|sep|>",
        "",
    ),
    "minimax_m3": (
        "MiniMax-M3.jinja",
        'Let me check.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_weather">'
        "]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[<days>2]<]minimax[>[</days>"
        "]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
        "Let me check.",
    ),
    "muse_glimmer": (  # the generation prompt is `<|start|>assistant`: the output starts at the recipient
        "muse-glimmer.jinja",
        ' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
        '<atem:parameter name="city">Paris</atem:parameter>\n<atem:parameter name="days">2</atem:parameter>\n'
        "</atem:invoke>\n</atem:function_calls>",
        "",
    ),
    "harmony": (  # the answer part, after the splitter took the analysis channel
        "openai-gpt-oss-120b.jinja",
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", "days": 2}',
        "",
    ),
}
# the model writes these ids; every other family's come from (seed, index)
WRITTEN_IDS = {
    "mistral_small": "abcDEF123",
    "mistral_nemo": "abcDEF123",
    "solar_open": "abcDEF123",
    "command_r7b": "0",
    "kimi_k2": "functions.get_weather:0",
}
# templates that cannot give back a stored reply as the model wrote it: what the template renders where the
# two part (the rest reconstructs: the next turn reuses the whole reply from the cache)
NO_RECONSTRUCTION = {
    "hermes": "<think>",  # Qwen3 writes an empty think block before the last assistant turn
    "glm": "<think>",  # likewise GLM 4.6
    "deepseek_v3_2": "</think>",
    "deepseek_v4": "</think>",
    "deepseek_v3_1": "</think>",
    "granite": "end_of_text|>",  # Granite 3.3's template renders no tool calls at all
    "nemotron_v2": "<SPECIAL_12>",  # Nemotron v2 renders the content as a message of its own
    "command_r7b": "THINKING|><|END_THINKING|>",  # an empty thinking block before the action
    "gemma4": "<|tool_call>call:",  # Gemma 4 renders the calls before the content
    "command_r_plus": "CHATBOT_TOKEN|>",  # a stored reply changes the prompt before it (the last turn's hint)
    # the answer parts here lack what the model writes before them, which the reasoning split takes
    # (tests/support/tool_cases.py's kimi3-* and minimax3-* cases, whole outputs, reconstruct)
    "kimi_k3": "<|close|>think<|sep|><|open|>r",  # K3 writes a response section before the calls
    "minimax_m3": "</mm:think>Let me check.",  # a turn without reasoning starts with a bare </mm:think>
    "deepseek_r1": "｜tool▁calls▁begin｜>",  # the template drops the reasoning once the reply is stored
}


def fmt_for(family: str) -> ToolFormat:
    return detect_format(vendored_template(CASES[family][0]))


def test_every_family_has_a_case() -> None:
    assert sorted(CASES) == sorted(s.name for s in FAMILIES)


@pytest.mark.parametrize("family", sorted(CASES))
def test_detects_the_family(family: str) -> None:
    fmt = fmt_for(family)
    assert isinstance(fmt, SyntaxFormat) and fmt.name == family
    # arguments as objects for every native template (its caps), but Granite 3.3's renders no calls at all
    # (Functionary v3.2's renders them as it gets them: JSON strings)
    assert fmt.args_string is (family in ("granite", "functionary_v3_2"))  # LFM2.5-8B's template: objects


@pytest.mark.parametrize(
    "name",
    ["google-gemma-2-2b-it.jinja", "microsoft-Phi-3.5-mini-instruct.jinja", "llama-cpp-rwkv-world.jinja"],
)
def test_templates_without_tools_stay_generic(name: str) -> None:
    assert isinstance(detect_format(vendored_template(name)), GenericFormat)


@pytest.mark.parametrize("family", sorted(CASES))
def test_parses_a_call(family: str) -> None:
    _, text, content = CASES[family]
    reply = fmt_for(family).parse(text, TOOLS, AUTO, seed="r1")
    assert reply.content == content
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("get_weather", PARIS)]
    style = by_name(family).id_style
    assert reply.tool_calls[0].id == WRITTEN_IDS.get(family, call_id("r1", 0, style, "get_weather"))
    # plain text is content as it is; `none` never parses calls
    assert fmt_for(family).parse("  It is sunny.\n", TOOLS, AUTO).content == "  It is sunny.\n"
    assert fmt_for(family).parse(text, TOOLS, NONE).tool_calls == ()


def _assert_prefixes(fmt: ToolFormat, text: str, seed: str = "s") -> list[PartialReply]:
    final = fmt.parse(text, TOOLS, AUTO, seed=seed)
    args = [canonical_arguments(c.arguments) for c in final.tool_calls]
    seen: dict[int, tuple[str, str]] = {}
    out = []
    for n in range(len(text) + 1):
        part = fmt.parse_partial(text[:n], TOOLS, seed=seed)
        assert final.content.startswith(part.content), (n, part.content)
        for c in part.calls:
            assert args[c.index].startswith(c.arguments), (n, c, args)
            assert (c.id, c.name) == (final.tool_calls[c.index].id, final.tool_calls[c.index].name)
            assert seen.setdefault(c.index, (c.id, c.name)) == (c.id, c.name)
        out.append(part)
    assert [c.arguments for c in out[-1].calls] == args  # the whole text streams the whole arguments
    return out


@pytest.mark.parametrize("family", sorted(CASES))
def test_streaming_prefixes_add_up(family: str) -> None:
    _, text, content = CASES[family]
    parts = _assert_prefixes(fmt_for(family), text)
    assert parts[-1].content == content
    # the arguments grow in steps: the name is out before the arguments are complete (unless the call's
    # id comes after its arguments: the call then waits for it, and its arguments come at once)
    growing = [p.calls[0].arguments for p in parts if p.calls]
    s = by_name(family)
    assert growing[-1] == '{"city": "Paris", "days": 2}'
    assert (len(set(growing)) == (1 if s.id_key and not s.id_first else len(set(growing))) and len(growing) > 1) or (
        s.id_key and not s.id_first
    )
    if not (s.id_key and not s.id_first):
        assert len(set(growing)) > 4


@pytest.mark.parametrize("family", sorted(f for f in CASES if by_name(f).parallel))
def test_parallel_calls(family: str) -> None:
    _, text, _ = CASES[family]
    fmt = fmt_for(family)
    two = _two_calls(family, text)
    reply = fmt.parse(two, TOOLS, AUTO, seed="p")
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("get_weather", PARIS), ("get_weather", OSLO)]
    assert len({c.id for c in reply.tool_calls}) == 2
    _assert_prefixes(fmt, two, "p")


@pytest.mark.parametrize("family", ["hermes", "qwen3_coder", "functionary_v3_1"])
def test_content_between_calls(family: str) -> None:
    _, text, content = CASES[family]
    fmt = fmt_for(family)
    call = text[len(content) :].strip()
    two = f"{content}\n{call}\n  Then Oslo:\n{call.replace('Paris', 'Oslo')}"
    reply = fmt.parse(two, TOOLS, AUTO, seed="b")
    assert reply.content == "Let me check.\n\nThen Oslo:"
    assert [c.arguments["city"] for c in reply.tool_calls] == ["Paris", "Oslo"]
    _assert_prefixes(fmt, two, "b")
    with pytest.raises(ToolCallParseError, match="text after the tool calls"):
        fmt.parse(two + "\nDone.", TOOLS, AUTO)


def _two_calls(family: str, text: str) -> str:
    """The case's output with a second call (OSLO) in the family's own way of writing several."""
    s = by_name(family)
    oslo_json = json.dumps(OSLO, ensure_ascii=False)
    if family == "functionary_v3_2":
        return f"{text}>>>get_weather\n{oslo_json}"
    if family == "gemma4":
        return text + '<|tool_call>call:get_weather{city:<|"|>Oslo "N"\n<|"|>,days:3}<tool_call|>'
    if family == "lfm2":
        return text.replace(")]", f"), get_weather(city={OSLO['city']!r}, days=3)]")
    if s.shape == "xml":
        second = text[text.find(s.call_open or s.fn_open) : text.rfind(s.call_close or s.fn_close)]
        second = second.replace("Paris", str(OSLO["city"])).replace(">2<", ">3<").replace("\n2\n", "\n3\n")
        second = second.replace(">2" + s.param_close, ">3" + s.param_close)  # MiniMax M3's `]<]minimax[>[</`
        end = s.call_close or s.fn_close
        if s.section_close:
            return text.replace(s.section_close, f"\n{second}{end}\n{s.section_close}")
        return text + "\n" + second + end
    paris_json = json.dumps(PARIS)
    if s.array:  # a second object in the array
        at = text.rfind("]")
        first = text[text.find("[", text.find(s.call_open) + len(s.call_open)) + 1 : at].strip()
        second = first.replace(paris_json, oslo_json).replace('"0"', '"1"').replace("abcDEF123", "xyzXYZ789")
        return text[:at].rstrip() + ", " + second + text[at:]
    if s.section_close:
        body = text[text.find(s.section_open) + len(s.section_open) : text.rfind(s.section_close)]
        second = body.replace(paris_json, oslo_json).replace(":0", ":1").replace("abcDEF123", "xyzXYZ789")
        return text.replace(s.section_close, second + s.section_close)
    body = text[text.find(s.call_open) :]
    return text + body.replace(paris_json, oslo_json).replace("abcDEF123", "xyzXYZ789")


@pytest.mark.parametrize("family", sorted(CASES))
def test_reconstruction(family: str) -> None:
    name, text, _ = CASES[family]
    source = vendored_template(name)
    fmt = fmt_for(family)
    reply = fmt.parse(text, TOOLS, AUTO, seed="r")
    prompt = check(source, "", reply, tools=[SPEC]).prompt
    reasoning = ""
    if isinstance(fmt, SyntaxFormat) and fmt.reasoning and prompt.rstrip().endswith(fmt.reasoning[0]):
        reasoning = "I will check."  # the generation prompt opened the block: the output closes it first
        text = f"{reasoning}\n{fmt.reasoning[1]}\n\n{text}"
    result = check(source, text, reply, tools=[SPEC], reasoning=reasoning)
    if family in NO_RECONSTRUCTION:
        assert not result.ok, "reconstructs now: take it off NO_RECONSTRUCTION"
        assert NO_RECONSTRUCTION[family] in result.describe().split("rendered")[1], result.describe()
    else:
        assert result.ok, result.describe()


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",  # not closed
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\nsoon\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",  # city is required
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call> and",
    ],
)
def test_malformed_xml_is_a_typed_error(text: str) -> None:
    fmt = fmt_for("qwen3_coder")
    with pytest.raises(ToolCallParseError):
        fmt.parse(text, TOOLS, AUTO)
    for n in range(len(text) + 1):
        assert isinstance(fmt.parse_partial(text[:n], TOOLS), PartialReply)  # never raises


@pytest.mark.parametrize(
    ("family", "text"),
    [
        ("mistral_small", '[TOOL_CALLS]get_weather[CALL_ID]abc[ARGS]{"city": 3}'),
        ("mistral_small", "[TOOL_CALLS]get weather[ARGS]{}"),
        ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_end|>"),
        ("mistral_nemo", '[TOOL_CALLS][{"name": "get_weather"}, 7]'),
        ("apertus", '<|tools_prefix|>[{"get_weather": {"city": "P"}, "x": 1}]<|tools_suffix|>'),
        ("harmony", " to=functions.get_weather<|channel|>commentary json<|message|>[1]"),
        ("deepseek_r1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"),
    ],
)
def test_malformed_calls_are_typed_errors(family: str, text: str) -> None:
    fmt = fmt_for(family)
    with pytest.raises(ToolCallParseError):
        fmt.parse(text, TOOLS, AUTO)
    for n in range(len(text) + 1):
        assert isinstance(fmt.parse_partial(text[:n], TOOLS), PartialReply)


def test_ids() -> None:
    assert call_id("seed", 0) == call_id("seed", 0) != call_id("seed", 1)
    assert re.fullmatch(r"call_[0-9a-f]{24}", call_id("seed", 0))
    assert call_id(None, 0) != call_id(None, 0)  # no seed: random
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call_id("seed", 3, "mistral"))
    assert call_id("seed", 2, "kimi", "add") == "functions.add:2"
    # Devstral writes no ids: 9 alphanumerics, which its template checks
    reply = fmt_for("mistral_args").parse(CASES["mistral_args"][1], TOOLS, AUTO, seed="x")
    assert re.fullmatch(r"[A-Za-z0-9]{9}", reply.tool_calls[0].id)


def test_partial_json_canonical_prefixes() -> None:
    value = {"a": [1, 2.50, 'x"\\ \u00e9\U0001f600'], "b": {"c": None, "d": True}, "e": -1e3, "f": ""}
    texts = [json.dumps(value), json.dumps(value, ensure_ascii=True, indent=1), '{"e":-1e3}']
    for text in texts:
        whole = json.dumps(json.loads(text), ensure_ascii=False)
        for n in range(len(text) + 1):
            node, _ = pj.parse(text, 0)
            head, _ = pj.parse(text[:n], 0)
            assert whole.startswith(pj.canonical(head)), (text[:n], pj.canonical(head))
        assert pj.canonical(node) == whole and node.complete
    with pytest.raises(pj._BadJSON):
        pj.parse('{"a" 1}', 0)


def test_generic_renders_tools_the_same_under_every_choice() -> None:
    fmt = GenericFormat()
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather?"}]
    plans = {c: fmt.render_plan(msgs, TOOLS, ToolChoice(c)) for c in ("auto", "required", "none")}
    assert plans["required"] == plans["none"] == plans["auto"]
    assert fmt.grammar(TOOLS, NONE) is None and fmt.grammar(TOOLS, REQUIRED) is not None
    assert fmt.parse('{"response": "Sunny."}', TOOLS, NONE).content == "Sunny."  # the prompt asks for JSON
    assert fmt.parse("Sunny.", TOOLS, NONE).content == "Sunny."
    assert fmt.partial('{"response": "Sun', TOOLS, NONE).content == "Sun"


def test_native_formats_render_the_same_under_every_choice() -> None:
    fmt = fmt_for("qwen3_coder")
    msgs = [{"role": "user", "content": "Weather?"}]
    assert fmt.render_plan(msgs, TOOLS, REQUIRED) == fmt.render_plan(msgs, TOOLS, NONE)
    assert fmt.grammar(TOOLS, NONE) is None


def test_firefunction_gets_its_functions_variable() -> None:
    plan = fmt_for("firefunction_v2").render_plan([{"role": "user", "content": "Hi"}], TOOLS, AUTO)
    assert json.loads(plan.kwargs["functions"]) == [SPEC]


# --- grammars in llama.cpp's sampler ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vocab]:
    v = Vocab(write_qwen(Path(tmp_path_factory.mktemp("syntax-vocab")) / "q.gguf"))
    yield v
    v.llm.close()


def _plain(fmt: ToolFormat, text: str) -> tuple[ToolFormat, str]:
    """The test vocabulary reads U+2581 as its space marker: DeepSeek's `▁` becomes `~` in syntax and text."""
    if "▁" not in text or not isinstance(fmt, SyntaxFormat):
        return fmt, text
    fields: dict[str, Any] = {k: v.replace("▁", "~") for k, v in vars(fmt.syntax).items() if isinstance(v, str)}
    return SyntaxFormat(dataclasses.replace(fmt.syntax, **fields), reasoning=fmt.reasoning), text.replace("▁", "~")


@pytest.mark.parametrize("family", sorted(CASES))
def test_grammar_in_llama_cpp(vocab: Vocab, family: str) -> None:
    _, text, content = CASES[family]
    fmt, text = _plain(fmt_for(family), text)
    calls = text[len(content) :].lstrip() if content else text.lstrip()
    if family == "functionary_v3_2":  # a reply that only calls starts with the recipient
        calls = text.split(">>>", 1)[1]
    required = fmt.grammar(TOOLS, REQUIRED, parallel=fmt.parallel)
    assert required is not None and not required.lazy
    assert vocab.accepts(required, calls), required.gbnf
    assert not vocab.accepts(required, calls.replace("get_weather", "get_wether"))
    assert not vocab.accepts(required, "It is sunny.")
    auto = fmt.grammar(TOOLS, AUTO, parallel=fmt.parallel)
    assert auto is not None and auto.lazy
    assert vocab.accepts(auto, text)
    assert vocab.accepts(auto, "It is sunny, no call needed.")
    if fmt.parallel:
        assert vocab.accepts(required, _two_calls(family, calls).replace("▁", "~"))


def test_grammar_waits_for_the_end_of_the_reasoning(vocab: Vocab) -> None:
    # Qwen3.5: Qwen3-Coder's syntax; its generation prompt opens the <think> block
    fmt = detect_format(vendored_template("Qwen3.5-4B.jinja"))
    assert isinstance(fmt, SyntaxFormat) and fmt.name == "qwen3_coder" and fmt.reasoning == ("<think>", "</think>")
    assert fmt.inside
    auto = fmt.grammar(TOOLS, AUTO)
    assert auto is not None
    call = CASES["qwen3_coder"][1].split("\n\n", 1)[1]
    assert vocab.accepts(auto, "I could write <tool_call> now, or not.</think>Sunny.")
    assert not vocab.accepts(auto, "Let me call.</think>\n<tool_call>\n<function=nope>")
    assert vocab.accepts(auto, "<think>I could write <tool_call> now, or not.</think>Sunny.")
    assert vocab.accepts(auto, "<think>Let me call.</think>\n" + call)
    assert not vocab.accepts(auto, "<think>Let me call.</think>\n<tool_call>\n<function=nope>")
    required = fmt.grammar(TOOLS, REQUIRED)
    assert required is not None
    assert vocab.accepts(required, "<think>Let me call.</think>\n" + call)
    assert vocab.accepts(required, call)
    assert not vocab.accepts(required, "<think>No.</think>\nSunny.")
    # Qwen3: the model opens the block itself; a call may also come without one
    qwen3 = fmt_for("hermes")
    assert isinstance(qwen3, SyntaxFormat) and qwen3.reasoning == ("<think>", "</think>") and not qwen3.inside
    auto = qwen3.grammar(TOOLS, AUTO)
    assert auto is not None
    hermes_call = CASES["hermes"][1]
    assert vocab.accepts(auto, "<think>Maybe <tool_call> later.</think>Sunny.")
    assert vocab.accepts(auto, hermes_call)
    assert not vocab.accepts(auto, hermes_call.replace("get_weather", "nope"))


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
        "It is sunny.",
    ],
)
def test_llama3_prefixes(text: str) -> None:
    from runtime.tools import Llama3Format

    parts = _assert_prefixes(Llama3Format(), text)
    assert parts[-1].content == ("" if "{" in text else text)


@pytest.mark.parametrize(
    "text",
    [
        '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}',
        '{"response": "It is \\"sunny\\"."}',
        "Plain text.",
    ],
)
def test_generic_prefixes(text: str) -> None:
    parts = _assert_prefixes(GenericFormat(), text)
    assert parts[-1].content == GenericFormat().parse(text, TOOLS, AUTO).content


class _NativeBackend(ScriptedBackend):
    """The scripted slot with a real template's tool format (rendering stays the scripted one)."""

    def __init__(self, template: str, reply: Any) -> None:
        super().__init__(reply)
        self._format = detect_format(vendored_template(template))

    def tool_format(self) -> ToolFormat:
        return self._format


async def test_agent_loop_over_a_native_format() -> None:
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    def reply(messages: Any) -> str:
        if messages[-1]["role"] == "tool":
            return "It is 84."
        return '[TOOL_CALLS]multiply[CALL_ID]abcDEF123[ARGS]{"a": 12, "b": 7}'

    backend = _NativeBackend("Mistral-Small-3.2-24B-Instruct-2506.jinja", reply)
    store = MemoryStore()
    async with Runtime.serve(backend, store) as rt:
        done = await rt.run("calc", "12 times 7?", tools=[multiply])
        assert done.text == "It is 84."
        assert [(s.call.id, s.call.name, s.call.arguments, s.result) for s in done.steps] == [
            ("abcDEF123", "multiply", {"a": 12, "b": 7}, "84")
        ]
        history = store.get("calc").messages
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
        assert history[2].tool_call_id == "abcDEF123"


@pytest.mark.parametrize("family", sorted(CASES))
def test_mangled_outputs_never_crash(family: str) -> None:
    """Cut, doubled or swapped pieces of a family's output: a parse, plain text or ToolCallParseError, never
    another exception; prefixes never raise."""
    _, text, _ = CASES[family]
    fmt = fmt_for(family)
    n = len(text)
    variants = [text[: n // 2], text[n // 3 :], text + text, text[::-1], text.replace('"', ""), text.replace(">", "")]
    variants += [text[:k] + text[k + 3 :] for k in range(0, n, max(1, n // 12))]
    for bad in variants:
        try:
            fmt.parse(bad, TOOLS, AUTO, seed="m")
        except ToolCallParseError as err:
            assert err.text == bad
        for k in range(0, len(bad) + 1, 7):
            assert isinstance(fmt.parse_partial(bad[:k], TOOLS, seed="m"), PartialReply)


def test_functionary_v3_2_content_is_the_message_to_all() -> None:
    fmt = fmt_for("functionary_v3_2")
    assert fmt.parse("all\nHello, world!\nWhat's up?", TOOLS, AUTO) == fmt.parse_calls(
        "all\nHello, world!\nWhat's up?", TOOLS
    )
    assert fmt.parse("all\nHello, world!\nWhat's up?", TOOLS, AUTO).content == "Hello, world!\nWhat's up?"
    assert fmt.parse("Hello there.", TOOLS, AUTO).content == "Hello there."  # no recipient: plain text
    assert fmt.parse_partial("al", TOOLS).content == ""
    _assert_prefixes(fmt, "all\nHello, world!")


def test_qwen3_coder_first_call_may_omit_its_opener_for_an_offered_tool_only() -> None:
    # llama-server's Qwen3-Coder handler: a bare `<function=NAME>` of an offered tool starts the first call
    fmt = fmt_for("qwen3_coder")
    bare = "Sure.\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    reply = fmt.parse(bare, TOOLS, AUTO, seed="q")
    assert reply.content == "Sure.\n"
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]
    _assert_prefixes(fmt, bare, "q")
    prose = "Write <function=nope> or <function=get_weather without the closer."
    assert fmt.parse(prose, TOOLS, AUTO) == fmt.parse_calls(prose, TOOLS)
    assert fmt.parse(prose, TOOLS, AUTO).content == prose and not fmt.parse(prose, TOOLS, AUTO).tool_calls
    lazy = fmt.grammar(TOOLS, AUTO)
    assert lazy is not None and lazy.trigger_words == ("<tool_call>", "<function=get_weather>")
