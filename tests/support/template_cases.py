"""The conversations the template parity test renders with every vendored template (llama-server request bodies),
and `render_body`: `apply_template` on such a body as llama-server renders it for the tests' tiny model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.templates import apply_template

BOS, EOS = "<s>", "<|im_end|>"  # the tiny model's tokens (it adds neither itself)

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city"}},
                "required": ["city"],
            },
        },
    }
]
CALL_ID = "call0A1b2"  # nine alphanumerics: Mistral templates insist

THREE_TURNS = [
    SYSTEM,
    {"role": "user", "content": "Hello there."},
    {"role": "assistant", "content": "Hi. What do you need?"},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "And another?"},
]
TOOL_ROUND = [
    SYSTEM,
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "It is 21 degrees."},
    {"role": "user", "content": "Thanks."},
]
REASONING = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6.", "reasoning_content": "Three plus three is six."},
    {"role": "user", "content": "And 4+4?"},
]

CASES: list[tuple[str, dict[str, Any]]] = [
    ("system+user", {"messages": [SYSTEM, {"role": "user", "content": "Hi!"}]}),
    ("three turns", {"messages": THREE_TURNS}),
    ("tools offered", {"messages": [SYSTEM, {"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}),
    ("tool call + result", {"messages": TOOL_ROUND, "tools": TOOLS}),
    ("reasoning earlier + last", {"messages": REASONING}),
    ("ends with assistant", {"messages": REASONING[:4], "add_generation_prompt": False}),
    ("enable_thinking true", {"messages": THREE_TURNS, "chat_template_kwargs": {"enable_thinking": True}}),
    ("enable_thinking false", {"messages": THREE_TURNS, "chat_template_kwargs": {"enable_thinking": False}}),
    ("reasoning, thinking off", {"messages": REASONING, "chat_template_kwargs": {"enable_thinking": False}}),
]

CALL_ID_2 = "call3C4d5"
PARALLEL = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Two cities, two calls.",
        "tool_calls": [
            {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": CALL_ID_2, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "21"},
    {"role": "tool", "tool_call_id": CALL_ID_2, "name": "get_weather", "content": "25"},
    {"role": "assistant", "content": "Paris 21, Rome 25."},
    {"role": "user", "content": "Which is warmer?"},
]

MORE_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "typed content",
        {
            "messages": [
                SYSTEM,
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
            ]
        },
    ),
    ("parallel calls, object arguments", {"messages": PARALLEL, "tools": TOOLS}),
    ("tool result last", {"messages": TOOL_ROUND[:4], "tools": TOOLS}),
    ("preserve_reasoning false", {"messages": REASONING, "chat_template_kwargs": {"preserve_reasoning": False}}),
    (
        "developer role",
        {"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    ),
    (
        "user only, no generation prompt",
        {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False},
    ),
]
CASES += MORE_CASES


def render_body(source: str, body: Mapping[str, Any], **kw: Any) -> str:
    """`apply_template` on a `/apply-template` request body (messages, tools, add_generation_prompt,
    chat_template_kwargs) with the tiny model's BOS and EOS; `kw` goes to `apply_template`."""
    return apply_template(
        source,
        body["messages"],
        tools=body.get("tools"),
        add_generation_prompt=body.get("add_generation_prompt", True),
        chat_template_kwargs=body.get("chat_template_kwargs"),
        bos_token=BOS,
        eos_token=EOS,
        **kw,
    )
