"""From a Responses request to the Runtime's turn, and from a `Reply` to Responses output items.

Input items become chat messages the way llama-server converts them (`server_chat_convert_responses_to_
chatcmpl`): a string input is one user message; `instructions` the system prompt; `developer` a system
message; consecutive assistant items (reasoning, message, function_call) merge into one assistant message
(reasoning as its `reasoning_content`, function calls as its `tool_calls`); a `function_call_output` is a
tool message. System and developer messages are merged into the one system prompt a session has (Codex
sends developer messages between turns): joined, after the instructions, with a blank line, in order.
Tools other than function tools are not offered to the model (one warning names them).

Every input item is also kept, normalized and with an id, for `GET /v1/responses/{id}/input_items`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.errors import BadInput
from runtime.grammar import schema_for
from runtime.log import get_logger
from runtime.reply import Reply, TokenProb
from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.probs import probs_json
from runtime.serve.http.responses.schema import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    decode_item,
)
from runtime.serve.http.speculation import speculative_option
from runtime.serve.http.tolerance import not_offered
from sessions.sampler_settings import MAX_N_PROBS

log = get_logger(__name__)

__all__ = ["Turn", "new_id", "output_items", "parse", "text_of", "usage"]


def new_id(prefix: str) -> str:
    """An unguessable id: `prefix` + "_" + 48 hex digits (ids are capabilities within a tenant)."""
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass
class Turn:
    """What one request asks: its new messages (system apart), the Runtime's keywords, its items to keep."""

    system: str | None  # the system prompt from leading system/developer input messages (None: none)
    messages: list[dict[str, Any]]  # user / assistant / tool messages, chat-completions shaped
    items: list[dict[str, Any]]  # the input items as stored and listed (each with an id)
    kwargs: dict[str, Any] = field(default_factory=dict)
    top_logprobs: int | None = None  # logprobs asked (`include` or `top_logprobs`): alternatives per token
    timings_per_token: bool = False  # llama-server's, on a stream
    return_progress: bool = False


LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for the output text's logprobs


def _items(req: ResponsesRequest) -> list[InputItem]:
    if isinstance(req.input, str):
        return [MessageItem(role="user", content=req.input)]
    items: list[InputItem] = []
    dropped: list[str] = []
    for i, raw in enumerate(req.input):
        item = decode_item(raw, i)
        if isinstance(item, str):
            dropped.append(item)
        else:
            items.append(item)
    if dropped:
        log.warning("serve.items_dropped", api="responses", items=sorted(set(dropped)))
    return items


def _tools(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools, as chat tools; the others (web_search, namespace, custom, mcp …) are not offered."""
    tools: list[dict[str, Any]] = []
    others: list[str] = []
    for i, t in enumerate(raw):
        if t.get("type") != "function":
            others.append(f"{t.get('type')}:{t.get('name', t.get('server_label', ''))}")
            continue
        try:
            tools.append(msgspec.convert(t, FunctionTool).chat_tool())
        except msgspec.ValidationError as e:
            raise ApiError.bad_request(f"tools[{i}]: {e}", param=f"tools[{i}]") from None
    not_offered("responses", others)
    return tools


def _stored(item: InputItem) -> dict[str, Any]:
    """The item as `input_items` lists it (OpenAI's shape, an id always set)."""
    if isinstance(item, MessageItem):
        kind = "output_text" if item.role == "assistant" else "input_text"
        return {
            "type": "message",
            "id": item.id or new_id("msg"),
            "role": item.role,
            "status": "completed",
            "content": [{"type": kind, "text": item.text()}],
        }
    if isinstance(item, FunctionCallItem):
        return {
            "type": "function_call",
            "id": item.id or new_id("fc"),
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments,
            "status": "completed",
        }
    if isinstance(item, FunctionCallOutputItem):
        return {
            "type": "function_call_output",
            "id": item.id or new_id("fco"),
            "call_id": item.call_id,
            "output": item.text(),
            "status": "completed",
        }
    return {
        "type": "reasoning",
        "id": item.id or new_id("rs"),
        "summary": [{"type": s.type, "text": s.text} for s in item.summary],
        "content": [{"type": "reasoning_text", "text": item.text()}],
    }


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message to merge into (the last one, if the conversation ends with an assistant)."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _messages(items: list[InputItem]) -> tuple[str | None, list[dict[str, Any]]]:
    systems: list[str] = []
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if isinstance(item, MessageItem) and item.role in ("system", "developer"):
            systems.append(item.text())  # merged into the one system prompt (module docstring)
        elif isinstance(item, MessageItem) and item.role == "user":
            out.append({"role": "user", "content": item.text()})
        elif isinstance(item, MessageItem):
            target = _assistant(out)
            target["content"] += item.text()
        elif isinstance(item, FunctionCallItem):
            try:
                arguments = json.loads(item.arguments) if item.arguments.strip() else {}
            except ValueError:
                raise ApiError.bad_request(
                    f"input[{i}].arguments is not JSON: {item.arguments[:80]!r}", param=f"input[{i}].arguments"
                ) from None
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": arguments}}
            _assistant(out).setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        else:
            assert isinstance(item, ReasoningItem)
            if out and out[-1]["role"] == "assistant":
                out[-1]["reasoning_content"] = item.text()
            else:
                out.append({"role": "assistant", "content": "", "reasoning_content": item.text()})
    return ("\n\n".join(systems) if systems else None), out


def _tool_choice(value: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise ApiError.bad_request(f"tool_choice {value!r} is not auto, none or required", param="tool_choice")
        return value
    if value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    if value.get("type") == "function" and isinstance(value.get("function"), dict):
        return value
    raise ApiError.bad_request("tool_choice must be auto, none, required or a function", param="tool_choice")


def _format(req: ResponsesRequest) -> str | dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return "json"
    if not isinstance(fmt.schema, dict):
        raise ApiError.bad_request("text.format.schema must be an object for json_schema", param="text.format.schema")
    try:
        schema_for(fmt.schema)  # the grammar converter's verdict now: a 400 that names the field, nothing queued
    except BadInput as e:
        name = f" {fmt.name!r}" if fmt.name else ""
        raise ApiError.bad_request(
            f"Invalid schema for text.format{name}: {e}", param="text.format.schema", code="invalid_json_schema"
        ) from None
    return fmt.schema


def parse(req: ResponsesRequest) -> Turn:
    """The request's turn; ApiError(400) for what the API refuses (nothing is queued or stored)."""
    if req.background:
        raise ApiError.bad_request("background responses are not supported", param="background")
    for name in ("conversation", "prompt"):  # server-side state: ignoring it would change the reply
        if getattr(req, name) is not None:
            raise ApiError.bad_request(f"{name} is not supported by this server (send the input itself)", param=name)
    items = _items(req)
    if not items:
        raise ApiError.bad_request("input must be a string or a non-empty list of items", param="input")
    system, messages = _messages(items)
    kw: dict[str, Any] = {}
    for name in ("temperature", "top_p", "seed", "top_k", "min_p"):
        if getattr(req, name) is not None:
            kw[name] = getattr(req, name)
    if req.max_output_tokens is not None:
        kw["max_tokens"] = req.max_output_tokens
    tools = _tools(req.tools or [])
    if tools:
        kw["tools"] = tools
        if req.tool_choice is not None:
            kw["tool_choice"] = _tool_choice(req.tool_choice)
        if req.parallel_tool_calls is not None:
            kw["parallel_tool_calls"] = req.parallel_tool_calls
    elif isinstance(req.tool_choice, str):
        _tool_choice(req.tool_choice)  # checked all the same
    fmt = _format(req)
    if fmt is not None:
        kw["response_format"] = fmt
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort in ("none", "minimal"):
        kw["reasoning"] = "off"
    elif effort is not None:
        kw["reasoning"] = "on"
    kw.update(speculative_option(req.speculative, req.speculative_n_max))
    top = _top_logprobs(req)
    if top is not None:
        kw["n_probs"] = max(1, top)
    stored = [_stored(item) for item in items]
    return Turn(
        system=system,
        messages=messages,
        items=stored,
        kwargs=kw,
        top_logprobs=top,
        timings_per_token=req.timings_per_token,
        return_progress=req.return_progress,
    )


def _top_logprobs(req: ResponsesRequest) -> int | None:
    """How many alternatives each output token's logprobs show (None: no logprobs asked)."""
    top = req.top_logprobs
    if top is not None and not 0 <= top <= MAX_N_PROBS:
        raise ApiError.bad_request(f"top_logprobs must be in [0, {MAX_N_PROBS}]", param="top_logprobs")
    if top is None and LOGPROBS not in (req.include or ()):
        return None
    return top or 0


def join_system(*parts: str | None) -> str | None:
    """The system prompt from its parts (the request's instructions, the input's system messages)."""
    present = [p for p in parts if p]
    return "\n\n".join(present) if present else None


# --- reply -----------------------------------------------------------------------------------------


def logprobs(probs: Sequence[TokenProb], top: int | None) -> list[dict[str, Any]]:
    """OpenAI's `logprobs` of an output text part (llama-server's entries, `id` included); [] when not asked."""
    return probs_json(probs, post=False, top=top) if top is not None else []


def output_items(reply: Reply, top: int | None = None) -> list[dict[str, Any]]:
    """The response's output: a reasoning item (if any), a message (if text, or nothing else), function calls;
    `top`: the message's logprobs with that many alternatives per token (None: not asked)."""
    out: list[dict[str, Any]] = []
    if reply.reasoning:
        out.append(reasoning_item(new_id("rs"), reply.reasoning, "completed"))
    if reply.text or not reply.tool_calls:
        out.append(message_item(new_id("msg"), reply.text, "completed", logprobs(reply.probs, top)))
    for call in reply.tool_calls:
        args = json.dumps(call.arguments, ensure_ascii=False)
        out.append(function_item(new_id("fc"), call.id, call.name, args, "completed"))
    return out


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def message_item(
    item_id: str, text: str | None, status: str, probs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = [] if text is None else [text_part(text, probs)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def text_part(text: str, probs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": probs or []}


def function_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}  # fmt: skip


def text_of(output: list[dict[str, Any]]) -> str:
    """The output's text (what the SDKs call `output_text`)."""
    return "".join(
        p.get("text", "") for item in output if item.get("type") == "message" for p in item.get("content", [])
    )


def usage(reply: Reply, reasoning_tokens: int) -> dict[str, Any]:
    u = reply.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": u.prompt_tokens + u.generated_tokens,
    }
