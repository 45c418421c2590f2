"""The Anthropic Messages API's bodies: the request as msgspec Structs, its conversion to the OpenAI-shaped
messages and options `Runtime.complete` takes, and a `Reply` as Anthropic's message.

Conversion follows llama-server's `/v1/messages` (tools/server/server-chat.cpp) where it decides, and the
Anthropic API reference where llama-server is silent:

- `system` (a string, or text blocks joined without a separator, as llama-server) becomes the system message;
  `role: "system"` entries inside `messages` (Claude Code sends them) are merged into it, in order, after
  a blank line each (a session has one system prompt; llama-server keeps them in place, which the
  templates that allow it render the same way only when they come first).
- A message's text blocks are joined with "\\n" (llama-server's join of text parts); `thinking` blocks of
  an assistant message become its `reasoning_content`, `redacted_thinking` blocks are dropped, `tool_use`
  blocks its `tool_calls` (arguments as JSON). A `document` block with a plain-text source is text.
- A user message's `tool_result` blocks become tool messages, placed before the message's text (the
  tool messages must follow the assistant's calls; llama-server puts them after); content is a string or
  text blocks (joined as above); `is_error` prefixes the result with "Error: " (the model sees it).
- `tools` become function tools (`input_schema` as the parameters); Anthropic's server and versioned
  tools (`web_search_…`, `bash_…`, `text_editor_…`, MCP toolsets …) are not offered to the model and are
  named in one `serve.tools_not_offered` warning. `tool_choice` `auto` / `any` / `tool` (by name) / `none`
  map to "auto" / "required" / the tool's name / "none" (naming a tool not offered is a 400).
- `thinking` `{"type": "enabled", "budget_tokens": N}` turns reasoning on with a budget of N tokens,
  `{"type": "disabled"}` turns it off; without it the model's default holds.
- `max_tokens` is required (400 without it, unlike llama-server's default of 4096; 0, Anthropic's cache
  pre-warming, is a 400 too); `stop_sequences`, `temperature`, `top_p`, `top_k` map one to one;
  `output_config.format` (`json_schema`) is the reply's JSON schema; `metadata` (its `user_id` may name
  the session) and `output_config.effort` are accepted and not used; `adaptive` / `between_tools`
  thinking keeps the model's default. `cache_control` anywhere is a hint and is ignored (every prefix is
  cached); other top-level fields (`service_tier`, `container`, `mcp_servers` …) are ignored and counted.
- Block types that carry what a text model cannot read (`image`, a `document` that is not plain text) are
  a 400 in Anthropic's shape, not silently dropped; other unknown block types (server tool calls and
  their results, …) are dropped with a warning naming them.

The reply: `content` is a thinking block (signature "", as llama-server: local models sign nothing),
a text block, then one `tool_use` block per call (an empty text is left out); `stop_reason` is
`tool_use`, `max_tokens`, `stop_sequence` (with `stop_sequence` set) or `end_turn`; `usage` counts
`input_tokens` as the prompt tokens not read from the cache, `cache_read_input_tokens` those that were
(Anthropic's and llama-server's split), `output_tokens` the generated ones.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from runtime.log import get_logger
from runtime.reply import Reply
from runtime.serve.http.errors import ApiError
from runtime.serve.http.normalize import billing_header, system_reminders
from runtime.serve.http.speculation import speculative_option
from runtime.serve.http.tolerance import not_offered

log = get_logger(__name__)

__all__ = [
    "CountRequest",
    "MessagesCall",
    "MessagesRequest",
    "from_request",
    "message_body",
    "message_id",
    "stop_reason",
    "usage",
]


# --- request ---------------------------------------------------------------------------------------


class TextBlock(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking"):
    data: str = ""


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool = False


Block = TextBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock
_BLOCKS: dict[str, type[Block]] = {
    "text": TextBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
}
_UNREADABLE = frozenset({"image"})  # what a text-only model cannot be given, and cannot silently lose


class InputMessage(msgspec.Struct):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class ToolDef(msgspec.Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    description: str | None = None
    type: str | None = None  # "custom" or absent: a client tool; anything else is not offered to the model


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None


class OutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, kw_only=True):
    format: OutputFormat | None = None
    effort: str | None = None  # accepted, not used


class CountRequest(msgspec.Struct, kw_only=True):
    """The fields that make the prompt: what /v1/messages/count_tokens reads (and /v1/messages)."""

    messages: list[InputMessage]
    model: str | None = None
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountRequest, kw_only=True):
    """POST /v1/messages; unknown fields are ignored (clients send more than a server needs)."""

    max_tokens: int | None = None  # required: checked in `from_request` for Anthropic's message
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    stream: bool = False
    speculative: str | None = None  # "ngram" | "none" (`runtime.serve.http.speculation`)
    speculative_n_max: int | None = msgspec.field(default=None, name="speculative.n_max")  # llama-server's: 0 off


@dataclass
class MessagesCall:
    """What one Messages request asks of the Runtime (`kwargs`: sampling, reasoning, tools)."""

    messages: list[dict[str, Any]]
    kwargs: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    stream: bool = False


def _join(texts: list[str]) -> str:
    """llama-server's join of text parts: "\\n" between them, none before the first non-empty text."""
    out = ""
    for text in texts:
        if out:
            out += "\n"
        out += text
    return out


class _Dropped:
    """The block kinds a conversion dropped (one warning for the request)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def warn(self) -> None:
        if self.kinds:
            log.warning("serve.blocks_dropped", api="messages", blocks=sorted(set(self.kinds)))


def _unreadable(kind: str, where: str) -> ApiError:
    return _bad(
        f"{where}: {kind!r} content is not supported: this server's model reads text only"
        " (dropping the block would change the request)"
    )


def _text_blocks(raw: list[dict[str, Any]], where: str, dropped: _Dropped) -> list[str]:
    """The texts of a list of raw blocks (a tool result's content, a system prompt)."""
    texts: list[str] = []
    for j, b in enumerate(raw):
        kind = b.get("type")
        if kind == "text":
            text = b.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}[{j}].text: Field required (a string)")
            texts.append(text)
        elif kind == "document":
            texts.append(_document_text(b, f"{where}[{j}]"))
        elif kind in _UNREADABLE:
            raise _unreadable(str(kind), f"{where}[{j}]")
        else:
            dropped.kinds.append(str(kind))
    return texts


def _result_text(block: ToolResultBlock, where: str, dropped: _Dropped) -> str:
    if block.content is None:
        text = ""
    elif isinstance(block.content, str):
        text = block.content
    else:
        text = _join(_text_blocks(block.content, f"{where}.content", dropped))
    if block.is_error:
        return f"Error: {text}" if text else "Error"
    return text


def _bad(message: str, param: str = "messages") -> ApiError:
    return ApiError.bad_request(message, param=param)


def _document_text(raw: dict[str, Any], where: str) -> str:
    """A `document` block's text when its source is plain text; a 400 otherwise (PDFs, images, URLs)."""
    source = raw.get("source")
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if isinstance(source, dict) and source.get("type") == "content" and isinstance(source.get("content"), str):
        return str(source["content"])
    raise _unreadable("document", where)


def _block(raw: dict[str, Any], where: str, dropped: _Dropped) -> Block | str | None:
    """One content block: a known block, a document's text, or None (dropped); 400 for what cannot be read."""
    kind = raw.get("type")
    cls = _BLOCKS.get(kind) if isinstance(kind, str) else None
    if cls is not None:
        try:
            return msgspec.convert(raw, cls)
        except msgspec.ValidationError as e:
            raise _bad(f"{where}: {e}") from None
    if kind == "document":
        return _document_text(raw, where)
    if kind in _UNREADABLE:
        raise _unreadable(str(kind), where)
    dropped.kinds.append(str(kind))
    return None


def _message(m: InputMessage, i: int, dropped: _Dropped) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, raw in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        b = _block(raw, where, dropped)
        if b is None or isinstance(b, RedactedThinkingBlock):
            continue
        if isinstance(b, str):
            texts.append(b)
        elif isinstance(b, TextBlock):
            texts.append(b.text)
        elif m.role == "user" and isinstance(b, ToolResultBlock):
            text = _result_text(b, where, dropped)
            results.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": text})
        elif m.role == "assistant" and isinstance(b, ThinkingBlock):
            thinking.append(b.thinking)
        elif m.role == "assistant" and isinstance(b, ToolUseBlock):
            args = msgspec.json.encode(b.input).decode()
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": args}})
        else:
            kind = type(b).__struct_config__.tag
            raise _bad(f"{where}: a {m.role} message cannot hold a {kind!r} block")
    if m.role == "user":
        out = list(results)
        if texts or not results:
            out.append({"role": "user", "content": _join(texts)})
        return out
    msg: dict[str, Any] = {"role": "assistant", "content": _join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return [msg]


def _system_text(
    system: str | list[dict[str, Any]], where: str, dropped: _Dropped, sep: str, normalize: bool = False
) -> str:
    texts = [system] if isinstance(system, str) else _text_blocks(system, where, dropped)
    if normalize:  # llama-server's rule, block by block (runtime.serve.http.normalize)
        texts = [billing_header(t) for t in texts]
    return sep.join(texts)


def _tools(req: CountRequest) -> dict[str, Any]:
    """`tools` and `tool_choice` as Runtime.complete takes them (nothing when no tool is offered)."""
    choice = req.tool_choice
    offered = [t for t in req.tools or [] if t.type in (None, "custom")]
    not_offered("messages", (f"{t.type}:{t.name}" for t in req.tools or [] if t.type not in (None, "custom")))
    if not offered:
        if choice is not None and choice.type not in ("auto", "none"):
            raise _bad(f"tool_choice {choice.type!r} needs tools the model is offered", "tool_choice")
        return {}
    tools = []
    for t in offered:
        fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            fn["description"] = t.description
        tools.append({"type": "function", "function": fn})
    out: dict[str, Any] = {"tools": tools}
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise _bad("tool_choice of type 'tool' needs the tool's name", "tool_choice")
            if all(t.name != choice.name for t in offered):
                raise _bad(f"tool_choice: tool {choice.name!r} is not among the tools offered", "tool_choice")
            out["tool_choice"] = choice.name
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use is not None:
            out["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return out


def _thinking(thinking: Thinking | None) -> dict[str, Any]:
    if thinking is None or thinking.type in ("adaptive", "between_tools"):
        return {}
    if thinking.type == "disabled":
        return {"reasoning": "off"}
    if thinking.budget_tokens is None:
        raise _bad("thinking of type 'enabled' needs budget_tokens", "thinking")
    return {"reasoning": "on", "reasoning_budget": thinking.budget_tokens}


def prompt_of(req: CountRequest, *, normalize: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The OpenAI-shaped messages and the prompt-shaping options (tools, reasoning) of a request
    (`normalize`: the named normalizations of `runtime.serve.http.normalize`)."""
    if not req.messages:
        raise _bad("messages must be a non-empty list")
    dropped = _Dropped()
    systems: list[str] = []
    if req.system is not None:
        systems.append(_system_text(req.system, "system", dropped, "", normalize))
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        if m.role == "system":  # merged into the one system prompt (module docstring)
            systems.append(_system_text(m.content, f"messages[{i}].content", dropped, "\n"))
        else:
            messages += _message(m, i, dropped)
    dropped.warn()
    if not messages:
        raise _bad("messages: at least one user or assistant message is required")
    head = [{"role": "system", "content": "\n\n".join(systems)}] if systems else []
    if normalize:
        messages = system_reminders(messages)
    return head + messages, _tools(req) | _thinking(req.thinking)


def from_request(req: MessagesRequest, session_id: str | None, *, normalize: bool = True) -> MessagesCall:
    """The Runtime call for a decoded request (`session_id`: already in the tenant's namespace)."""
    if req.max_tokens is None:
        raise _bad("max_tokens: Field required", "max_tokens")
    if req.max_tokens < 1:
        raise _bad(f"max_tokens: must be at least 1, not {req.max_tokens} (no cache pre-warming)", "max_tokens")
    if req.metadata is not None and not all(isinstance(k, str) for k in req.metadata):
        raise _bad("metadata must be an object", "metadata")
    messages, kw = prompt_of(req, normalize=normalize)
    kw["max_tokens"] = req.max_tokens
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(req, name)
        if value is not None:
            kw[name] = value
    if req.stop_sequences:
        kw["stop"] = list(req.stop_sequences)
    if req.output_config is not None and req.output_config.format is not None:
        kw["response_format"] = req.output_config.format.schema
    kw.update(speculative_option(req.speculative, req.speculative_n_max))
    return MessagesCall(messages=messages, kwargs=kw, session_id=session_id, stream=req.stream)


# --- reply -----------------------------------------------------------------------------------------


def message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def stop_reason(reply: Reply) -> str:
    if reply.tool_calls:
        return "tool_use"
    if reply.finish_reason == "length":
        return "max_tokens"
    if reply.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def usage(reply: Reply) -> dict[str, int]:
    u = reply.usage
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.generated_tokens,
    }


def tool_use_blocks(reply: Reply) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in reply.tool_calls]


def message_body(reply: Reply, *, id: str, model: str) -> dict[str, Any]:
    """Anthropic's message for a reply."""
    content: list[dict[str, Any]] = []
    if reply.reasoning:
        content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    content += tool_use_blocks(reply)
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(reply),
        "stop_sequence": reply.stop_sequence if stop_reason(reply) == "stop_sequence" else None,
        "usage": usage(reply),
    }
