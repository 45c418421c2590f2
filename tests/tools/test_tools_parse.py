"""The tool-call parsers on hand-written model outputs, well-formed and malformed."""

from __future__ import annotations

import json
import random
import re

import pytest

from runtime.errors import ToolCallParseError
from runtime.tools import (
    GenericFormat,
    HermesFormat,
    Llama3Format,
    ParsedReply,
    Tool,
    ToolCall,
    ToolChoice,
    ToolFormat,
    as_tools,
)

TOOLS = as_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        },
    ]
)
AUTO = ToolChoice("auto")


def calls(reply: ParsedReply) -> list[tuple[str, dict[str, object]]]:
    for c in reply.tool_calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", c.id), c.id
    return [(c.name, c.arguments) for c in reply.tool_calls]


def parse(fmt: ToolFormat, text: str, choice: ToolChoice = AUTO, tools: tuple[Tool, ...] = TOOLS) -> ParsedReply:
    return fmt.parse(text, tools, choice)


# --- Hermes / Qwen ---------------------------------------------------------------------------------------

H = HermesFormat()
QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_hermes_reads_calls() -> None:
    r = parse(H, QWEN_CALL)
    assert r.content == "" and calls(r) == [("get_weather", {"city": "Paris"})]
    two = QWEN_CALL + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
    r = parse(H, "Let me check.\n" + two)
    assert r.content == "Let me check."
    assert calls(r) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
    assert len({c.id for c in r.tool_calls}) == 2
    compact = '<tool_call>{"name":"add","arguments":"{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
    assert calls(parse(H, compact)) == [("add", {"a": 1, "b": 2})]


def test_hermes_plain_text() -> None:
    assert parse(H, "  It is sunny.\n") == ParsedReply("  It is sunny.\n")  # plain text stays as it is
    assert parse(H, QWEN_CALL, ToolChoice("none")) == ParsedReply(QWEN_CALL)
    assert parse(H, QWEN_CALL, AUTO, ()) == ParsedReply(QWEN_CALL)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "not complete JSON"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "not closed"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool', "not closed"),
        ('<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>', "'delete_all'"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>', "missing required property 'b'"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": "2"}}\n</tool_call>', "expected integer"),
        ('<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n["add"]\n</tool_call>', "must be a JSON object"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "not a string"),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call> and more', "text after"),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "without its opening"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": NaN, "b": 1}}\n</tool_call>', "add"),
        ("<tool_call>" + "[" * 5000 + "</tool_call>", "JSON"),
    ],
)
def test_hermes_malformed(text: str, why: str) -> None:
    with pytest.raises(ToolCallParseError, match=why) as info:
        parse(H, text)
    assert info.value.text == text


def test_required_choice_needs_a_call() -> None:
    with pytest.raises(ToolCallParseError, match="needs a tool call"):
        parse(H, "no call", ToolChoice("required"))
    with pytest.raises(ToolCallParseError, match="'get_weather'"):  # only `add` may be called
        parse(H, QWEN_CALL, ToolChoice("function", "add"))


# --- Llama 3.x -------------------------------------------------------------------------------------------

L = Llama3Format()


def test_llama3_reads_a_call() -> None:
    r = parse(L, '{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert r.content == "" and calls(r) == [("get_weather", {"city": "Paris"})]
    r = parse(L, '<|python_tag|>{"type": "function", "name": "add", "parameters": {"a": 1, "b": 2}}  \n')
    assert calls(r) == [("add", {"a": 1, "b": 2})]
    assert calls(parse(L, ' {"name": "add", "arguments": {"a": 1, "b": 2}}')) == [("add", {"a": 1, "b": 2})]


def test_llama3_plain_text() -> None:
    assert parse(L, "It is sunny in Paris.") == ParsedReply("It is sunny in Paris.")
    assert parse(L, '{"city": "Paris"}') == ParsedReply('{"city": "Paris"}')  # JSON, but not a call
    assert parse(L, 'Call {"name": "add"}') == ParsedReply('Call {"name": "add"}')  # a call must open the reply


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"name": "get_weather", "parameters": {"city": "Pa', "not complete JSON"),
        ('{"name": "nope", "parameters": {}}', "'nope'"),
        ('{"name": "add", "parameters": {"a": 1}}', "'b'"),
        ('{"name": "add", "parameters": {"a": 1, "b": 2}} then text', "text after"),
        ('{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 1, "b": 2}}', "after"),
        ("<|python_tag|>print(1)", "python_tag"),
        ('{"name": 3, "parameters": {}}', "not a string"),
    ],
)
def test_llama3_malformed(text: str, why: str) -> None:
    with pytest.raises(ToolCallParseError, match=why):
        parse(L, text)


# --- generic (llama-server's JSON reply) ------------------------------------------------------------------

G = GenericFormat()


def test_generic_reads_calls_and_responses() -> None:
    r = parse(G, '{"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}}}')
    assert r.content == "" and calls(r) == [("add", {"a": 1, "b": 2})]
    r = parse(
        G,
        '{ "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "call_1___"},'
        ' {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "abcd"}]}',
    )
    assert calls(r) == [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]
    assert "call_1___" not in {c.id for c in r.tool_calls}  # ids are always fresh
    assert parse(G, '{"response": "Hello!"}\n') == ParsedReply("Hello!")
    assert parse(G, '{"response": {"a": 1}}') == ParsedReply('{\n  "a": 1\n}')
    assert parse(G, "plain words") == ParsedReply("plain words")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"tool_call": {"name": "add", "arguments": {"a": 1, "b"', "not complete JSON"),
        ('{"tool_call": {"name": "nope", "arguments": {}}}', "'nope'"),
        ('{"tool_call": ["add"]}', "must be an object"),
        ('{"tool_calls": []}', "non-empty list"),
        ('{"tool_calls": {"name": "add"}}', "non-empty list"),
        ('{"answer": "x"}', "expected 'tool_call'"),
        ('{"response": "x"} extra', "text after"),
        ('{"response": "x"', "not complete JSON"),
    ],
)
def test_generic_malformed(text: str, why: str) -> None:
    with pytest.raises(ToolCallParseError, match=why):
        parse(G, text)


def test_generic_required_refuses_a_response() -> None:
    with pytest.raises(ToolCallParseError, match="needs a tool call"):
        parse(G, '{"response": "no"}', ToolChoice("required"))


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (H, "Sure.\n" + QWEN_CALL + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'),
        (L, '<|python_tag|>{"name": "add", "parameters": {"a": 10, "b": -2}}'),
        (G, '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "abcd"}]}'),
        (G, '{"response": "a \\"quoted\\" answer"}'),
    ],
)
def test_cut_or_damaged_output_never_crashes(fmt: ToolFormat, text: str) -> None:
    """Every prefix, and random edits, give a reply or ToolCallParseError, never another exception."""
    rng = random.Random(7)
    variants = [text[:i] for i in range(len(text) + 1)]
    for _ in range(300):
        chars = list(text)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(chars))
            chars[i] = rng.choice(['"', "{", "}", "<", ">", "\n", "x", "1", ":", ","])
        variants.append("".join(chars))
    for v in variants:
        try:
            reply = fmt.parse(v, TOOLS, AUTO)
        except ToolCallParseError:
            continue
        for c in reply.tool_calls:
            assert isinstance(c, ToolCall) and c.name in {"add", "get_weather"}
            json.dumps(c.arguments)
