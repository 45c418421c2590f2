"""llama-server's generic tool calling, for templates that do not render tools (SmolLM2 ...).

As llama.cpp's `common_chat_params_init_generic` with minja's polyfills did (llama.cpp before the PEG
auto-parser; the llama.cpp vendored in llama-cpp-python 0.3.36 has no generic handler any more):

- the system message gets `RESPOND` appended (after a blank line; it becomes the system message if
  there is none), then `TOOLS_INTRO` + the tools as indented JSON + the tool-call example that the
  template itself renders (see `tool_call_example`); with `tool_choice="none"` only the tools part;
- past assistant tool calls become the assistant's content `{"tool_calls": [{"name", "arguments", "id"}],
  "content"?}` (indented JSON), tool results become user messages `{"tool_response": {"content",
  "tool_call_id"}}`;
- the reply is constrained (not lazily) to the JSON schema `anyOf [{"tool_call": call}, {"response":
  string}]`, only the call part when a call is required. (`{"tool_calls": [call, ...]}`, calls with an
  `id`, is llama-server's parallel form; it turns parallel calls off for templates that cannot render
  tool calls, i.e. for every template that gets this format, so `ToolPlan` never asks for it.) The
  parser reads that JSON back (either form).
- `tool_choice="none"`: tools described the same way (with `RESPOND`: unlike llama-server, so a
  "required" turn followed by a "none" turn keeps the prompt prefix), no grammar; a `{"response": ...}`
  reply is unwrapped, other text is the content as it is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from runtime.errors import InvalidTool, ToolCallParseError
from runtime.log import get_logger
from runtime.tools.calls import ParsedReply, PartialCall, PartialReply, call_id, decode_json_prefix, make_call
from runtime.tools.formats.base import RenderPlan, ToolFormat
from runtime.tools.grammar.builder import GrammarBuilder, ToolGrammar
from runtime.tools.parse import partial_json as pj
from runtime.tools.spec import Tool, ToolChoice

__all__ = ["RESPOND", "TOOLS_INTRO", "GenericFormat", "add_system", "tool_call_example"]

log = get_logger(__name__)

RESPOND = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply to the "
    "user's request"
)
TOOLS_INTRO = "You can call any of the following tools to satisfy the user's requests: "
EXAMPLE_CALL = {"tool_calls": [{"name": "tool_name", "arguments": {"arg1": "some_value"}, "id": "call_1___"}]}

Render = Callable[[list[dict[str, Any]], bool], str]


def _dump(value: Any) -> str:
    """JSON as nlohmann's `dump(2)` writes it."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def add_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """minja's `add_system`: append `text` to the system message after a blank line, or insert one."""
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def tool_call_example(render: Render, eos_token: str) -> str:
    """The example call as the template renders an assistant message whose content is the example JSON.

    `render(messages, add_generation_prompt)` renders with the model's template. As minja does: the text
    the template adds after the generation prompt, without a final end-of-turn token; "" if it fails.
    """
    user = {"role": "user", "content": "Hey"}
    try:
        prefix = render([user], True)
        full = render([user, {"role": "assistant", "content": _dump(EXAMPLE_CALL)}], False)
    except Exception as err:  # a template may refuse the dummy chat; minja then gives no example
        log.warning("tools.no_example", error=str(err))
        return ""
    eos_last = full.rfind(eos_token) if eos_token else -1
    if eos_last >= 0 and (
        eos_last == len(prefix) - len(eos_token) or (full.endswith("\n") and eos_last == len(full) - len(eos_token) - 1)
    ):
        full = full[:eos_last]
    common = 0
    for i in range(min(len(prefix), len(full))):
        if prefix[i] != full[i]:
            break
        if prefix[i] == "<":
            continue
        common = i + 1
    example = full[common:]
    return example if "tool_name" in example or "some_value" in example else ""


class GenericFormat(ToolFormat):
    """Tools described in the system message; the reply is JSON: a call or a response."""

    name = "generic"
    parallel = False  # llama-server turns parallel calls off for templates that cannot render them

    def __init__(self, example: str = "") -> None:
        self.example = example

    @classmethod
    def for_template(cls, render: Render, eos_token: str) -> GenericFormat:
        """The format with the example call rendered by this template."""
        return cls(tool_call_example(render, eos_token))

    def system_text(self, tools: Sequence[Tool], choice: ToolChoice) -> str:
        """What is appended to the system message (after a blank line) for these tools: the same under every
        `tool_choice`, so switching it between turns keeps the prompt prefix (only the grammar differs)."""
        parts = [RESPOND]
        tools_text = TOOLS_INTRO + _dump([t.openai() for t in tools])
        if self.example:
            tools_text += "\n\nExample tool call syntax:\n\n" + self.example + "\n\n"
        parts.append(tools_text)
        return "\n\n".join(parts)

    def render_plan(self, messages: list[dict[str, Any]], tools: Sequence[Tool], choice: ToolChoice) -> RenderPlan:
        msgs = [dict(m) for m in messages]
        if tools:
            msgs = add_system(msgs, self.system_text(tools, choice))
        return RenderPlan(messages=[_polyfill(m) for m in msgs], tools=None)

    def schema(self, tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool = False) -> dict[str, Any] | None:
        """The JSON schema the reply is constrained to (None with no allowed tool)."""
        if choice.mode == "answer":  # tools described, but the reply must be the answer
            return {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
        allowed = choice.allowed(tools)
        if not allowed:
            return None
        calls: list[dict[str, Any]] = []
        defs: dict[str, Any] = {}
        for tool in allowed:
            params = dict(tool.parameters)
            for key, value in params.pop("$defs", {}).items():
                if defs.setdefault(key, value) != value:
                    raise InvalidTool(f"tools define $defs {key!r} differently; rename one")
            call: dict[str, Any] = {
                "type": "object",
                "properties": {"name": {"type": "string", "const": tool.name}, "arguments": params},
                "required": ["name", "arguments"],
                "description": tool.description,
            }
            if parallel:
                call["properties"]["id"] = {"type": "string", "minLength": 4}
                call["required"].append("id")
            calls.append(call)
        one = calls[0] if len(calls) == 1 else {"anyOf": calls}
        if parallel:
            tool_call = {
                "type": "object",
                "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
                "required": ["tool_calls"],
            }
        else:
            tool_call = {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]}
        response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
        schema: dict[str, Any] = tool_call if choice.must_call else {"anyOf": [tool_call, response]}
        if defs:
            schema = {**schema, "$defs": defs}
        return schema

    def grammar(self, tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool = False) -> ToolGrammar | None:
        schema = self.schema(tools, choice, parallel=parallel)
        if schema is None:
            return None
        b = GrammarBuilder()
        b.schema("", schema)
        return ToolGrammar(b.text(), lazy=False)

    def parse_answer(self, text: str) -> ParsedReply:
        return self.parse_calls(text, ())  # {"response": ...}, which the answer grammar enforces

    def parse_plain(self, text: str) -> ParsedReply:
        """Under `tool_choice="none"` the prompt still asks for JSON: a `{"response": ...}` reply is unwrapped,
        anything else is the text as it is."""
        try:
            reply = self.parse_calls(text, ())
        except ToolCallParseError:
            return ParsedReply(text)
        return reply if not reply.tool_calls else ParsedReply(text)

    def partial(self, text: str, tools: Sequence[Tool], choice: ToolChoice, *, seed: str | None = None) -> PartialReply:
        allowed = choice.allowed(tools) if choice.mode != "answer" else []
        return self.parse_partial(text, allowed, seed=seed)

    def parse_partial(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> PartialReply:
        body = text.lstrip()
        if not body:
            return PartialReply("")
        if not body.startswith("{"):
            return PartialReply(text)
        try:
            node, _ = pj.parse(body, 0)
        except (pj._BadJSON, RecursionError):
            return PartialReply("")
        if node.kind != "object":
            return PartialReply("")
        response = node.get("response")
        if response is not None:
            return PartialReply(response.scalar if response.kind == "string" else "")
        items: list[pj.Node] = []
        one = node.get("tool_call")
        if one is not None:
            items = [one]
        many = node.get("tool_calls")
        if many is not None and many.kind == "array":
            items = many.items
        calls: list[PartialCall] = []
        for i, item in enumerate(items):
            name = item.get("name") if item.kind == "object" else None
            if name is None or not name.complete or name.kind != "string":
                break
            args = item.get("arguments")
            text_args = pj.canonical(args) if args is not None and args.kind == "object" else ""
            calls.append(PartialCall(i, call_id(seed, i), name.scalar, text_args))
        return PartialReply("", tuple(calls))

    def parse_calls(self, text: str, tools: Sequence[Tool], *, seed: str | None = None) -> ParsedReply:
        body = text.strip()
        if not body.startswith("{"):
            return ParsedReply(text)
        value, end = decode_json_prefix(body, 0, "the JSON reply")
        if body[end:].strip():
            raise ToolCallParseError("text after the JSON reply", text)
        if not isinstance(value, dict):
            raise ToolCallParseError("the reply is not a JSON object", text)
        if "tool_calls" in value:
            items = value["tool_calls"]
            if not isinstance(items, list) or not items or not all(isinstance(c, dict) for c in items):
                raise ToolCallParseError("tool_calls must be a non-empty list of objects", text)
            calls = (
                make_call(c.get("name"), c.get("arguments", {}), tools, text, call_id(seed, i))
                for i, c in enumerate(items)
            )
            return ParsedReply("", tuple(calls))
        if "tool_call" in value:
            call = value["tool_call"]
            if not isinstance(call, dict):
                raise ToolCallParseError("tool_call must be an object", text)
            return ParsedReply(
                "", (make_call(call.get("name"), call.get("arguments", {}), tools, text, call_id(seed, 0)),)
            )
        if "response" in value:
            response = value["response"]
            return ParsedReply(response if isinstance(response, str) else _dump(response))
        raise ToolCallParseError("expected 'tool_call', 'tool_calls' or 'response' in the JSON reply", text)


def _polyfill(message: dict[str, Any]) -> dict[str, Any]:
    """minja's polyfills for a template without tool calls or tool responses."""
    if message.get("tool_calls"):
        calls = []
        for tc in message["tool_calls"]:
            fn = tc["function"]
            args = fn["arguments"]
            if isinstance(args, str):
                with contextlib.suppress(ValueError):
                    args = json.loads(args)
            entry = {"name": fn["name"], "arguments": args}
            if "id" in tc:
                entry["id"] = tc["id"]
            calls.append(entry)
        obj: dict[str, Any] = {"tool_calls": calls}
        if message.get("content"):
            obj["content"] = message["content"]
        message = {k: v for k, v in message.items() if k != "tool_calls"}
        message["content"] = _dump(obj)
    if message.get("role") == "tool":
        response: dict[str, Any] = {}
        if "name" in message:
            response["tool"] = message["name"]
        response["content"] = message.get("content")
        if "tool_call_id" in message:
            response["tool_call_id"] = message["tool_call_id"]
        message = {k: v for k, v in message.items() if k != "name"}
        message["role"] = "user"
        message["content"] = _dump({"tool_response": response})
    return message
