"""`runtime.templates.apply_template` on its own (no llama-server): each expected string below was produced by
llama-server's `/apply-template` (the oracle build, `--jinja --chat-template-file`, on a tiny model whose BOS is
`<s>` and EOS `<|im_end|>`), for hand-written templates that exercise one workaround each and for a few of the
templates llama.cpp keeps (read from the vendored tree, tests/support/vendor_tree.py).
tests/templates/test_template_parity.py compares every vendored template with a running llama-server.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from runtime.errors import BadInput, ChatTemplateError
from runtime.log import capture_logs
from runtime.templates import CHATML_TEMPLATE, apply_template, default_enable_thinking, template_caps
from runtime.templates.load import chat_template_source, choose_templates
from tests.support.template_cases import BOS, CASES, render_body
from tests.support.vendor_tree import template_path

CASE = dict(CASES)

# reads `tools` only when defined, prints arguments as objects, `add_generation_prompt` and `enable_thinking`
TOOLS_TEMPLATE = (
    "{%- if tools is defined -%}TOOLS {{ tools | tojson }}\n{% else -%}NO TOOLS\n{% endif -%}\n"
    "{%- for m in messages -%}\n[{{ m.role }}]{{ m.content }}\n{%- if m.tool_calls is defined -%}\n"
    "{%- for c in m.tool_calls %} CALL {{ c.function.name }} {{ c.function.arguments | tojson }} "
    "{{ c.function.arguments.city }}{% endfor -%}\n{%- endif %}\n{% endfor -%}\n"
    "{{ 'GEN=' ~ (add_generation_prompt is defined) ~ ' THINK=' ~ enable_thinking ~ ' ' ~ bos_token ~ '|' "
    "~ eos_token }}\n"
)
# prints arguments as they come (strings), tojson with an indent, a generator through tojson
STRING_ARGS_TEMPLATE = (
    "{%- for m in messages -%}\n[{{ m.role }}]{{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<call>{{ c.function.arguments }}</call>{% endfor %}{% endif %}\n{% endfor -%}\n"
    "{{ {'a': 1.5, 'b': [true, none, 'x\\ny'], 'c': 'é'} | tojson(indent=2) }}\n"
    "{{- (messages | map(attribute='role') | list | tojson) }}\n"
)
# refuses a system message: llama-server merges it into the first user message
NO_SYSTEM_TEMPLATE = (
    "{%- for m in messages -%}\n{%- if m['role'] == 'system' -%}{{ raise_exception('System role not supported') }}"
    "{%- endif -%}\n<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor -%}\n"
    "{%- if add_generation_prompt %}<assistant>{% endif -%}\n"
)

TOOL_JSON = (
    '[{"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city.", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, '
    '"required": ["city"]}}}]'
)


def render(source: str, case: str, **kw: Any) -> str:
    return render_body(source, CASE[case], **kw)


def vendored(name: str) -> str:
    return template_path(name).read_text(encoding="utf-8")


def test_tools_are_undefined_without_tools_and_generation_prompt_only_when_true() -> None:
    assert render(TOOLS_TEMPLATE, "system+user") == (
        "NO TOOLS\n[system]You are a terse assistant.[user]Hi!GEN=True THINK=False <s>|<|im_end|>"
    )
    assert render(TOOLS_TEMPLATE, "tool call + result") == (
        f"TOOLS {TOOL_JSON}\n[system]You are a terse assistant.[user]Weather in Paris?"
        '[assistant] CALL get_weather {"city": "Paris"} Paris[tool]{"temp": 21}[assistant]It is 21 degrees.'
        "[user]Thanks.GEN=True THINK=False <s>|<|im_end|>"
    )


def test_arguments_stay_json_text_for_a_template_that_prints_them_and_tojson_is_llama_cpps() -> None:
    assert render(STRING_ARGS_TEMPLATE, "parallel calls, object arguments") == (
        '[user]Weather in Paris and Rome?[assistant]<call>{"city":"Paris"}</call><call>{"city":"Rome"}</call>'
        "[tool]21[tool]25[assistant]Paris 21, Rome 25.[user]Which is warmer?"
        '{\n  "a": 1.5,\n  "b": [\n    true,\n    null,\n    "x\\ny"\n  ],\n  "c": "é"\n}'
        '["user", "assistant", "tool", "tool", "assistant", "user"]'
    )


def test_a_system_message_is_merged_where_the_template_has_no_system_role() -> None:
    assert not template_caps(NO_SYSTEM_TEMPLATE).supports_system_role
    assert render(NO_SYSTEM_TEMPLATE, "three turns") == (
        "<user>You are a terse assistant.\nHello there.</user>\n<assistant>Hi. What do you need?</assistant>\n"
        "<user>Name a prime.</user>\n<assistant>Seven.</assistant>\n<user>And another?</user>\n<assistant>"
    )


def test_qwen3_drops_earlier_reasoning_and_keeps_the_trailing_assistants() -> None:
    src = vendored("Qwen-Qwen3-0.6B.jinja")
    turns = (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(src, "reasoning earlier + last") == (
        turns + "6.<|im_end|>\n<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(src, "ends with assistant") == turns + "<think>\nThree plus three is six.\n</think>\n\n6.<|im_end|>\n"
    assert default_enable_thinking(src)
    off = render(src, "enable_thinking false")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_gpt_oss_gets_thinking_and_its_final_return_becomes_end() -> None:
    src = vendored("openai-gpt-oss-120b.jinja")
    before = time.strftime("%Y-%m-%d")
    got = render(src, "ends with assistant")
    dates = {before, time.strftime("%Y-%m-%d")}
    assert got in {
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        f"Knowledge cutoff: 2024-06\nCurrent date: {d}\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4.<|end|>"
        "<|start|>user<|message|>And 3+3?<|end|><|start|>assistant<|channel|>analysis<|message|>"
        "Three plus three is six.<|end|><|start|>assistant<|channel|>final<|message|>6.<|end|>"
        for d in dates
    }


def test_gemma2_merges_the_system_prompt_and_a_bos_the_tokenizer_adds_is_stripped() -> None:
    src = vendored("google-gemma-2-2b-it.jinja")
    want = "<s><start_of_turn>user\nYou are a terse assistant.\nHi!<end_of_turn>\n<start_of_turn>model\n"
    assert render(src, "system+user") == want
    assert render(src, "system+user", add_bos=True) == want.removeprefix(BOS)
    with pytest.raises(ChatTemplateError, match="refused"):
        render(src, "tool call + result")  # llama-server refuses it too


def test_apertus_defaults_to_thinking_off() -> None:
    assert not default_enable_thinking(vendored("Apertus-8B-Instruct.jinja"))
    assert default_enable_thinking(vendored("google-gemma-4-31B-it.jinja"))


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ("not a list", "list"),
        ([{"content": "no role"}], "role"),
        ([{"role": "user"}], "content"),
        ([{"role": "assistant"}], "content"),
        ([{"role": "user", "content": 3}], "content"),
        ([{"role": "user", "content": [{"type": "image_url", "text": "x"}]}], "content part"),
        ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}], "function name"),
    ],
)
def test_malformed_messages_are_refused_with_a_typed_error(messages: Any, match: str) -> None:
    with pytest.raises(ChatTemplateError, match=match) as e:
        apply_template(CHATML_TEMPLATE, messages)
    assert isinstance(e.value, BadInput)


def test_template_errors_are_typed() -> None:
    with pytest.raises(ChatTemplateError, match="does not parse"):
        apply_template("{% for %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="refused the conversation: nope"):
        apply_template("{{ raise_exception('nope') }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="enable_thinking"):
        apply_template(CHATML_TEMPLATE, [{"role": "user", "content": "x"}], chat_template_kwargs={"enable_thinking": 1})


def test_chatml_fallback_is_logged_and_an_override_wins(tmp_path: Any) -> None:
    with capture_logs() as logs:
        chosen = choose_templates(None, None, None, model="m.gguf")
    assert chosen.default == CHATML_TEMPLATE and chosen.fallback
    assert [e["event"] for e in logs] == ["template.fallback"]
    tool_use = choose_templates(None, "default {{ messages }}", "tools {{ tools }}")
    assert tool_use.for_tools(False) == "default {{ messages }}" and tool_use.for_tools(True) == "tools {{ tools }}"
    only_tools = choose_templates(None, None, "tools {{ tools }}")
    assert only_tools.for_tools(False) == "tools {{ tools }}"
    override = choose_templates("mine {{ x }}", "default", "tools")
    assert override.for_tools(True) == "mine {{ x }}"
    path = tmp_path / "t.jinja"
    path.write_text("{{ 'from a file' }}", encoding="utf-8")
    assert chat_template_source(path) == chat_template_source(str(path)) == "{{ 'from a file' }}"
    assert chat_template_source("{{ 'inline' }}") == "{{ 'inline' }}"
    with pytest.raises(BadInput, match="no Jinja source and no readable file"):
        chat_template_source(tmp_path / "missing.jinja")
