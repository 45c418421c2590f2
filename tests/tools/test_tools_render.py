"""Rendering tools and tool messages through turnstile's path equals the template's own rendering, and a
tool-using conversation's prompts extend each other (so the cached prefix is reused)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import llama_cpp
import msgspec
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from runtime.tools import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    SyntaxFormat,
    Tool,
    ToolChoice,
    ToolFormat,
    as_tools,
)
from runtime.tools.base import RenderPlan
from runtime.tools.formats import detect_format, render_prompt, template_uses_tools
from runtime.tools.generic import RESPOND, TOOLS_INTRO
from sessions import Message, Session, history
from sessions.model import ToolCall
from tests.support.tiny_models import CHATML_TEMPLATE
from tests.support.tool_models import write_llama3, write_qwen

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = as_tools([WEATHER])
AUTO = ToolChoice("auto")


class Model:
    """A tiny model's vocabulary and chat template, rendered the way the engine renders."""

    def __init__(self, path: Path) -> None:
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.template = self.llm.metadata["tokenizer.chat_template"]
        self.bos = self.llm.detokenize([self.llm.token_bos()], special=True).decode()
        self.eos = self.llm.detokenize([self.llm.token_eos()], special=True).decode()
        self.formatter = Jinja2ChatFormatter(template=self.template, eos_token=self.eos, bos_token=self.bos)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return render_prompt(self.formatter, _plain(messages), add_generation_prompt=add_generation_prompt)

    def fmt(self, **options: Any) -> ToolFormat:
        return detect_format(self.template, self.render, self.eos, **options)

    def prompt(self, fmt: ToolFormat, session: Session, tools: tuple[Tool, ...] = TOOLS, gen: bool = True) -> str:
        plan = fmt.render_plan(session.chat_messages(), tools, AUTO)
        return render_prompt(self.formatter, plan, add_generation_prompt=gen)

    def tokens(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode(), add_bos=False, special=True))

    def reference(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw: Any) -> str:
        """The template rendered directly with jinja2 (transformers' settings), for hand-written messages."""
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        return env.from_string(self.template).render(
            messages=messages, tools=tools, add_generation_prompt=True, bos_token=self.bos, eos_token=self.eos, **kw
        )


def _plain(messages: list[dict[str, Any]]) -> RenderPlan:
    return RenderPlan(messages=messages, tools=None)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Model]]:
    d = tmp_path_factory.mktemp("tool-models")
    out = {"qwen": Model(write_qwen(d / "qwen.gguf")), "llama3": Model(write_llama3(d / "llama3.gguf"))}
    yield out
    for m in out.values():
        m.llm.close()


def conversation() -> Session:
    """system, user, a call, its result, the answer, a new user message."""
    return Session(
        id="c",
        system="You are terse.",
        messages=(
            Message("user", "Weather in Paris?", 1.0),
            Message("assistant", "", 2.0, (ToolCall("call_a", "get_weather", {"city": "Paris"}),)),
            Message("tool", "sunny, 21 °C", 3.0, tool_call_id="call_a"),
            Message("assistant", "Sunny, 21 °C.", 4.0),
            Message("user", "And Oslo?", 5.0),
        ),
        created=1.0,
        updated=5.0,
    )


REFERENCE_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 21 °C"},
    {"role": "assistant", "content": "Sunny, 21 °C."},
    {"role": "user", "content": "And Oslo?"},
]


def test_detects_formats(models: dict[str, Model]) -> None:
    assert isinstance(models["qwen"].fmt(), HermesFormat)
    assert isinstance(models["llama3"].fmt(), Llama3Format)
    assert template_uses_tools(models["qwen"].template) and not template_uses_tools(CHATML_TEMPLATE)
    assert isinstance(detect_format(CHATML_TEMPLATE), GenericFormat)
    uses = "{% for t in tools %}{{ t | tojson }}{% endfor %}"
    assert isinstance(detect_format(uses + '<tool_call>\n{"name": <function-name>}</tool_call>'), HermesFormat)
    xml = detect_format(uses + "{{ '<tool_call>\\n<function=' + name }}<parameter=")  # Qwen3.5 XML
    assert isinstance(xml, SyntaxFormat) and xml.name == "qwen3_coder"
    glm = detect_format(uses + "<tool_call>{{ tc.name }}<arg_key>")
    assert isinstance(glm, SyntaxFormat) and glm.name == "glm"
    assert isinstance(detect_format('<tool_call>{"name": x}</tool_call>'), GenericFormat)  # tools not rendered
    llama = "{{ tools }}<|start_header_id|>ipython<|end_header_id|>"
    assert isinstance(detect_format(llama + '{"name": "x", "parameters": {}}'), Llama3Format)
    v31 = detect_format(llama + "<function=x>")  # functionary v3.1
    assert isinstance(v31, SyntaxFormat) and v31.name == "functionary_v3_1"


def test_qwen_rendering_equals_the_template(models: dict[str, Model]) -> None:
    m = models["qwen"]
    ours = m.prompt(m.fmt(), conversation())
    assert ours == m.reference(REFERENCE_MESSAGES, [WEATHER])
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny, 21 °C\n</tool_response><|im_end|>\n"
    ) in ours
    assert '\n<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Weather' in ours


def test_llama3_rendering_equals_the_template(models: dict[str, Model]) -> None:
    m = models["llama3"]
    ours = m.prompt(m.fmt(date_string="01 Dec 2026"), conversation())
    ref = m.reference(REFERENCE_MESSAGES, [WEATHER], tools_in_user_message=False, date_string="01 Dec 2026")
    assert ours == ref
    assert "Today Date: 01 Dec 2026\n\n" in ours
    assert (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}'
        '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"sunny, 21 °C"<|eot_id|>'
    ) in ours
    assert ours.index('"name": "get_weather"') < ours.index("<|start_header_id|>user")  # tools in the system part


@pytest.mark.parametrize(
    ("model", "reply", "options"),
    [
        ("qwen", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', {}),
        ("qwen", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', {}),
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', {"date_string": "01 Dec 2026"}),
    ],
)
def test_each_prompt_extends_the_last(
    models: dict[str, Model], model: str, reply: str, options: dict[str, Any]
) -> None:
    """Turn 2's prompt tokens start with turn 1's prompt + the reply + end of turn: the cache covers them."""
    m = models[model]
    fmt = m.fmt(**options)
    s1 = conversation()
    p1 = m.prompt(fmt, s1)
    parsed = fmt.parse(reply, TOOLS, AUTO)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", {"city": "Oslo"})]
    s2 = history.append_reply(s1, parsed.content, tool_calls=parsed.tool_calls, now=6.0)
    s2 = history.append_tool_results(s2, {parsed.tool_calls[0].id: "rain"}, now=7.0)
    p2 = m.prompt(fmt, s2)
    assert p2.startswith(p1 + reply + m.eos)
    t1, tr, t2 = m.tokens(p1), m.tokens(reply), m.tokens(p2)
    assert t2[: len(t1) + len(tr) + 1] == [*t1, *tr, m.llm.token_eos()]
    answer = "Rain in Oslo."
    s3 = history.append_reply(s2, answer, now=8.0)
    s3 = msgspec.structs.replace(s3, messages=(*s3.messages, Message("user", "Thanks", 9.0)))
    p3 = m.prompt(fmt, s3)
    assert p3.startswith(p2 + answer + m.eos)
    t3 = m.tokens(p3)
    assert t3[: len(t2)] == t2


def test_generic_prompt_is_llama_servers(models: dict[str, Model]) -> None:
    """The ChatML template has no tools: the system text and the history polyfills are llama-server's."""

    def render(messages: list[dict[str, Any]], gen: bool) -> str:
        f = Jinja2ChatFormatter(template=CHATML_TEMPLATE, eos_token="<|im_end|>", bos_token="<s>")
        return render_prompt(f, _plain(messages), add_generation_prompt=gen)

    fmt = detect_format(CHATML_TEMPLATE, render, "<|im_end|>")
    assert isinstance(fmt, GenericFormat)
    example = (
        '{\n  "tool_calls": [\n    {\n      "name": "tool_name",\n      "arguments": {\n        "arg1": "some_value"\n'
        '      },\n      "id": "call_1___"\n    }\n  ]\n}'
    )
    assert fmt.example == example
    tools_json = (
        '[\n  {\n    "type": "function",\n    "function": {\n      "name": "get_weather",\n'
        '      "description": "Weather in a city.",\n      "parameters": {\n        "type": "object",\n'
        '        "properties": {\n          "city": {\n            "type": "string"\n          }\n        },\n'
        '        "required": [\n          "city"\n        ]\n      }\n    }\n  }\n]'
    )
    system = (
        "You are terse.\n\nRespond in JSON format, either with `tool_call` (a request to call tools) or with "
        "`response` reply to the user's request\n\nYou can call any of the following tools to satisfy the user's "
        f"requests: {tools_json}\n\nExample tool call syntax:\n\n{example}\n\n"
    )
    assert RESPOND in system and TOOLS_INTRO in system
    plan = fmt.render_plan(conversation().chat_messages(), TOOLS, AUTO)
    assert plan.tools is None
    assert plan.messages == [
        {"role": "system", "content": system},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": '{\n  "tool_calls": [\n    {\n      "name": "get_weather",\n      "arguments": {\n'
            '        "city": "Paris"\n      },\n      "id": "call_a"\n    }\n  ]\n}',
        },
        {
            "role": "user",
            "tool_call_id": "call_a",
            "content": '{\n  "tool_response": {\n    "content": "sunny, 21 °C",\n    "tool_call_id": "call_a"\n  }\n}',
        },
        {"role": "assistant", "content": "Sunny, 21 °C."},
        {"role": "user", "content": "And Oslo?"},
    ]
    none = fmt.render_plan(conversation().chat_messages(), TOOLS, ToolChoice("none"))
    assert none.messages[0]["content"] == system  # the same under every tool_choice: the prefix is kept
    no_system = fmt.render_plan([{"role": "user", "content": "hi"}], TOOLS, AUTO)
    assert no_system.messages[0] == {"role": "system", "content": system.removeprefix("You are terse.\n\n")}
    # the cached prefix: turn 1's whole prompt starts turn 2's
    chatml = Jinja2ChatFormatter(CHATML_TEMPLATE, "<|im_end|>", "<s>")
    p1 = render_prompt(chatml, fmt.render_plan(history.truncate(conversation(), 1).chat_messages(), TOOLS, AUTO))
    p2 = render_prompt(chatml, fmt.render_plan(conversation().chat_messages(), TOOLS, AUTO))
    assert p2.startswith(p1) and p1.endswith("<|im_start|>assistant\n")


def test_smollm2_gets_the_generic_format(smollm2_path: Path) -> None:
    """SmolLM2's template does not render tools: generic, with the example rendered by its own template."""
    m = Model(smollm2_path)
    try:
        assert not template_uses_tools(m.template)
        fmt = m.fmt()
        assert isinstance(fmt, GenericFormat)
        assert fmt.example == json.dumps(
            {"tool_calls": [{"name": "tool_name", "arguments": {"arg1": "some_value"}, "id": "call_1___"}]}, indent=2
        )
        prompt = m.prompt(fmt, history.truncate(conversation(), 2))
        assert prompt.startswith(
            "<|im_start|>system\nYou are terse.\n\nRespond in JSON format, either with `tool_call`"
        )
        assert prompt.endswith('"id": "call_a"\n    }\n  ]\n}<|im_end|>\n<|im_start|>assistant\n')
    finally:
        m.llm.close()
