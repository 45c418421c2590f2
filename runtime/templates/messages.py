"""OpenAI-style messages turned into what llama-server hands a chat template, with its workarounds.

`parse_messages` checks and normalises messages as llama-server's `common_chat_msgs_parse_oaicompat` and
`common_chat_msg::to_json_oaicompat` do: content is never null (`""`), `reasoning_content`, `name` and
`tool_call_id` appear only when not empty, tool-call arguments are JSON text (a dict is dumped compactly).
`template_messages` then applies llama.cpp's workarounds for the template at hand (common/chat.cpp and the
specialised handlers in common/parsers/): content as string or typed parts per the template's caps,
`developer` as `system` (not for gpt-oss), a system message merged into the next one when the template has
no system role, string arguments parsed into objects when the template reads them as objects, StepFun's
trimmed contents, gpt-oss's and LFM2's `thinking`, Ministral's content blocks, Gemma 4's `tool_responses`
(older template) and DeepSeek V4's tool results in call order.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.errors import ChatTemplateError
from runtime.templates.caps import TemplateCaps

__all__ = ["parse_messages", "parse_tools", "template_messages"]

Msg = dict[str, Any]


def _dump(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def _text(part_list: list[Any]) -> str:
    """Typed content joined as llama.cpp joins it (newlines, none next to a media marker)."""
    text, last_media = "", False
    for p in part_list:
        kind = p.get("type", "")
        if kind == "text":
            if not last_media and text:
                text += "\n"
            last_media = False
        elif kind == "media_marker":
            last_media = True
        else:
            continue
        text += str(p.get("text", ""))
    return text


def parse_messages(messages: Sequence[Mapping[str, Any]]) -> list[Msg]:
    """The messages as llama-server's JSON for the template; raises ChatTemplateError on a malformed one."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"messages must be a list of objects, not {type(messages).__name__}")
    out: list[Msg] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"message {i} is not an object")
        role = m.get("role")
        if not isinstance(role, str):
            raise ChatTemplateError(f"message {i} has no 'role' string")
        has_content, has_calls = "content" in m, "tool_calls" in m and m["tool_calls"] is not None
        if role != "assistant" and not has_content:
            raise ChatTemplateError(f"message {i}: all non-assistant messages must contain 'content'")
        if role == "assistant" and not has_content and not has_calls:
            raise ChatTemplateError(f"message {i}: an assistant message must contain 'content' or 'tool_calls'")
        msg: Msg = {"role": role}
        content = m.get("content")
        if isinstance(content, str):
            msg["content"] = content
        elif isinstance(content, list) and content:
            parts = []
            for p in content:
                if not isinstance(p, Mapping) or p.get("type") not in ("text", "media_marker"):
                    raise ChatTemplateError(f"message {i}: unsupported content part {p!r}")
                if not isinstance(p.get("text"), str):
                    raise ChatTemplateError(f"message {i}: a content part has no 'text' string")
                parts.append({"type": p["type"], "text": p["text"]})
            has_media = any(p["type"] == "media_marker" for p in parts)
            msg["content"] = _text(parts) if has_media else parts
        elif content is None or isinstance(content, list):
            msg["content"] = ""
        else:
            raise ChatTemplateError(f"message {i}: 'content' must be a string, a list of parts or null")
        for key in ("reasoning_content", "name", "tool_call_id"):
            v = m.get(key)
            if v is None:
                continue
            if not isinstance(v, str):
                raise ChatTemplateError(f"message {i}: {key!r} must be a string")
            if v:
                msg[key] = v
        if has_calls:
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise ChatTemplateError(f"message {i}: 'tool_calls' must be a list")
            out_calls = []
            for c in calls:
                if not isinstance(c, Mapping) or c.get("type", "function") != "function":
                    raise ChatTemplateError(f"message {i}: unsupported tool call {c!r}")
                fn = c.get("function")
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise ChatTemplateError(f"message {i}: a tool call has no function name")
                args = fn.get("arguments", "")
                call: Msg = {
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else _dump(args)},
                }
                if isinstance(c.get("id"), str) and c["id"]:
                    call["id"] = c["id"]
                out_calls.append(call)
            if out_calls:
                msg["tool_calls"] = out_calls
        out.append(msg)
    return out


def parse_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[Msg] | None:
    """OpenAI tool definitions as llama-server hands them to the template (None when there are none)."""
    if not tools:
        return None
    out = []
    for t in tools:
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(t.get("function"), Mapping):
            raise ChatTemplateError(f"unsupported tool {t!r}: expected {{'type': 'function', 'function': {{...}}}}")
        fn = t["function"]
        if not isinstance(fn.get("name"), str):
            raise ChatTemplateError(f"tool {t!r} has no function name")
        params = fn.get("parameters")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description") or "",
                    "parameters": copy.deepcopy(dict(params)) if isinstance(params, Mapping) else {},
                },
            }
        )
    return out


def _trim(s: str) -> str:
    return s.strip(" \t\n\r")


def _normalize_content(msgs: list[Msg], caps: TemplateCaps) -> None:
    only_string = caps.supports_string_content and not caps.supports_typed_content
    only_typed = caps.supports_typed_content and not caps.supports_string_content
    for m in msgs:
        c = m.get("content")
        if only_typed and isinstance(c, str):
            m["content"] = [{"type": "text", "text": c}]
        elif only_string and isinstance(c, list):
            m["content"] = _text(c)


def _merge_system(msgs: list[Msg]) -> None:
    if msgs and msgs[0]["role"] == "system":
        first = msgs.pop(0)
        if msgs:
            msgs[0]["content"] = f"{first['content']}\n{msgs[0]['content']}"


def _object_arguments(msgs: list[Msg]) -> None:
    for m in msgs:
        for c in m.get("tool_calls", ()):
            args = c["function"].get("arguments")
            if isinstance(args, str):
                try:
                    c["function"]["arguments"] = json.loads(args)
                except ValueError as e:
                    raise ChatTemplateError(f"failed to parse tool call arguments as JSON: {e}") from e


def _ministral(msgs: list[Msg]) -> list[Msg]:
    out = []
    for m in msgs:
        if m["role"] not in ("system", "assistant"):
            out.append(m)
            continue
        blocks: list[Any] = []
        if isinstance(m.get("reasoning_content"), str):
            blocks.append({"type": "thinking", "thinking": m["reasoning_content"]})
        c = m.get("content")
        if isinstance(c, str):
            blocks.append({"type": "text", "text": c})
        elif isinstance(c, list):
            blocks.extend(c)
        adj = dict(m)
        adj["content"] = blocks
        adj.pop("reasoning_content", None)
        out.append(adj)
    return out


def _thinking(msgs: list[Msg], *, drop_content_with_calls: bool) -> list[Msg]:
    out = []
    for m in msgs:
        if isinstance(m.get("reasoning_content"), str):
            m = dict(m)
            m["thinking"] = m["reasoning_content"]
            if drop_content_with_calls and m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out


def _gemma4_tool_responses(msgs: list[Msg]) -> list[Msg]:
    out: list[Msg] = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls = list(m["tool_calls"])
        reasoning = m.get("reasoning_content") if isinstance(m.get("reasoning_content"), str) else None
        responses: list[Msg] = []
        i += 1
        while i < len(msgs) and msgs[i].get("role") == "tool":
            cur = msgs[i]
            resp: Any = None
            if "content" in cur:
                resp = cur["content"]
                if isinstance(resp, str):
                    with contextlib.suppress(ValueError):
                        resp = json.loads(resp)
            name = ""
            if len(responses) < len(calls):
                name = str(calls[len(responses)].get("function", {}).get("name", ""))
            if not name:
                name = str(cur.get("tool_call_id", ""))
            responses.append({"name": name, "response": resp})
            i += 1
        content: Any = None
        if i < len(msgs) and msgs[i].get("role") == "assistant" and not msgs[i].get("tool_calls"):
            c = msgs[i].get("content")
            if (isinstance(c, str) and c) or (isinstance(c, list) and c):
                content = c
                i += 1
        turn: Msg = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        if content is not None:
            turn["content"] = content
        if reasoning is not None:
            turn["reasoning_content"] = reasoning
        out.append(turn)
    return out


def _deepseek_v4_order(msgs: list[Msg]) -> list[Msg]:
    adj = list(msgs)
    order: dict[str, int] = {}
    i = 0
    while i < len(adj):
        role = adj[i].get("role", "")
        if role == "assistant" and adj[i].get("tool_calls"):
            order = {c["id"]: k for k, c in enumerate(adj[i]["tool_calls"]) if c.get("id")}
            i += 1
            continue
        if role not in ("user", "tool"):
            i += 1
            continue
        end, positions = i, []
        while end < len(adj) and adj[end].get("role", "") in ("user", "tool"):
            if adj[end].get("role") == "tool":
                positions.append(end)
            end += 1
        if len(positions) > 1 and order:
            results = sorted((adj[p] for p in positions), key=lambda m: order.get(m.get("tool_call_id", ""), 0))
            for p, r in zip(positions, results, strict=True):
                adj[p] = r
        i = end
    return adj


def template_messages(source: str, msgs: list[Msg], caps: TemplateCaps) -> list[Msg]:
    """The messages (from `parse_messages`) with llama.cpp's workarounds for this template applied."""
    msgs = copy.deepcopy(msgs)
    if "You have access to the following functions in JSONSchema format" in source:  # StepFun
        for m in msgs:
            if isinstance(m.get("content"), str):
                m["content"] = _trim(m["content"])
            elif isinstance(m.get("content"), list):
                for p in m["content"]:
                    if p.get("type") == "text":
                        p["text"] = _trim(p["text"])
            if "reasoning_content" in m:
                m["reasoning_content"] = _trim(m["reasoning_content"])
                if not m["reasoning_content"]:
                    del m["reasoning_content"]
    _normalize_content(msgs, caps)
    if "<|channel|>" not in source:
        for m in msgs:
            if m["role"] == "developer":
                m["role"] = "system"
    if not caps.supports_system_role:
        _merge_system(msgs)
    if caps.supports_tool_calls:
        for m in msgs:
            if "tool_calls" in m and "content" not in m:
                m["content"] = ""
    if caps.supports_object_arguments:
        _object_arguments(msgs)
    return _specialised(source, msgs)


def _specialised(src: str, msgs: list[Msg]) -> list[Msg]:
    """The message changes of llama.cpp's specialised handlers, tried in its order (first match wins)."""
    if "[SYSTEM_PROMPT]" in src and "[TOOL_CALLS]" in src and "[ARGS]" in src and "[CALL_ID]" not in src:
        return _ministral(msgs)
    if "<|channel|>" in src:
        return _thinking(msgs, drop_content_with_calls=True)
    for marker in (
        ("<atem:function_calls>", "<|eom|>"),
        (">>>all", ">>>${recipient}"),
        ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
        ("<|open|>", "<|close|>", "<|end_of_msg|>"),
        ("<role>ASSISTANT</role>", "<arg_key>"),
        ("<|START_TEXT|>", "<|START_ACTION|>"),
    ):
        if all(s in src for s in marker):
            return msgs
    if ("<|tool_list_start|>" in src and "<|tool_list_end|>" in src) or (
        "List of tools: [" in src and "<|tool_list_start|>" not in src
    ):
        return _thinking(msgs, drop_content_with_calls=False)
    if "<|role_sep|>" in src and "<|message_sep|>" in src and "<|function_call|>" not in src:
        return msgs
    if "]<]minimax[>[" in src and "<tool_call>" in src and "<invoke name=" in src:
        return msgs
    if "dsml_token" in src and "DSML" in src and ("function_calls" in src or "tool_calls" in src):
        return _deepseek_v4_order(msgs) if "function_calls" not in src else msgs
    if "'<|tool_call>call:'" in src and "{#- OpenAI Chat Completions:" not in src:
        return _gemma4_tool_responses(msgs)
    return msgs
