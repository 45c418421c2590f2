"""The OpenAI Responses API's request body and input items as msgspec Structs (POST /v1/responses).

A known field with the wrong type is a 400 naming it; an unknown field is ignored (top-level ones are
counted in /metrics, `runtime.serve.http.tolerance`), as a client release may add one. The fields the
official clients and the Agents SDK send and that turnstile does not act on (`include`, `truncation`,
`user`, `service_tier`, `prompt_cache_key`, `client_metadata` …) are declared and accepted; `conversation`
and `prompt` (server-side state turnstile does not hold) are declared so that a value is a 400 naming
them. Input items are decoded one by one by their `type` (a message may omit it), so that an error names
the item: `input[3]`; item types that are not messages, function calls, their outputs or reasoning
(server tools' calls, MCP, custom tools …) are dropped with a warning naming them, except `item_reference`
(a 400: what it names would be missing). Content a text model cannot read (`input_image`, `input_file`,
`input_audio`) is a 400.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "InputItem",
    "MessageItem",
    "ReasoningItem",
    "ResponsesRequest",
    "TextPart",
    "decode_item",
]

TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"})


class _Strict(msgspec.Struct, kw_only=True):
    """Known fields are typed strictly; unknown ones are ignored (module docstring)."""


class TextPart(_Strict):
    """A text content part: `input_text` (user, system) or `output_text` (assistant); `refusal` is text too."""

    type: str  # input_text, output_text, text, refusal; others checked by `decode_item`
    text: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None

    @property
    def value(self) -> str:
        return self.text if self.text is not None else (self.refusal or "")


class MessageItem(_Strict):
    """A message item: `{"role", "content"}` (content a string or text parts), `type` "message" or absent."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.value for p in self.content)


class FunctionCallItem(_Strict):
    """A function call the model made earlier (given back with the conversation)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    """A function's result: `output` a string or text parts."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.value for p in self.output)


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Strict):
    """A reasoning item the model produced earlier: its `content` (reasoning_text parts) goes back to the
    template as the next assistant message's reasoning."""

    type: Literal["reasoning"]
    summary: list[ReasoningText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | None = None
    id: str | None = None
    status: str | None = None
    encrypted_content: str | None = None

    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "".join(p.text for p in parts)


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem

_ITEM_TYPES: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def _check_parts(item: InputItem, index: int) -> InputItem:
    parts = (
        item.content
        if isinstance(item, MessageItem)
        else item.output
        if isinstance(item, FunctionCallOutputItem)
        else None
    )
    for j, part in enumerate(parts if isinstance(parts, list) else []):
        if part.type not in TEXT_PARTS:
            raise msgspec.ValidationError(
                f"content of type {part.type!r} is not supported: this server's model reads text only"
                f" - at `$.input[{index}].content[{j}]`"
            )
    return item


def decode_item(raw: object, index: int) -> InputItem | str:
    """One input item, checked (`msgspec.ValidationError` naming `input[index]` when it is wrong), or the
    type of an item that is dropped (module docstring)."""
    if not isinstance(raw, dict):
        raise msgspec.ValidationError(f"Expected `object`, got `{type(raw).__name__}` - at `$.input[{index}]`")
    kind = raw.get("type", "message")
    if not isinstance(kind, str):
        raise msgspec.ValidationError(f"Expected `str` - at `$.input[{index}].type`")
    cls = _ITEM_TYPES.get(kind)
    if kind == "item_reference":
        raise msgspec.ValidationError(
            f"item references are not supported (send the item itself) - at `$.input[{index}]`"
        )
    if cls is None:
        return kind
    try:
        return _check_parts(msgspec.convert(raw, cls), index)
    except msgspec.ValidationError as e:
        text = str(e).replace("at `$", f"at `$.input[{index}]", 1)
        if "at `$" not in text:
            text += f" - at `$.input[{index}]`"
        raise msgspec.ValidationError(text) from None


class FunctionTool(_Strict):
    """A function tool in the Responses shape (flat, not nested under `function`)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat_tool(self) -> dict[str, Any]:
        """The chat-completions tool dict the Runtime takes."""
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters or {"type": "object", "properties": {}}}
        if self.description is not None:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextOptions(_Strict):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningOptions(_Strict):
    effort: str | None = None  # "none" / "minimal": off; any other level: on
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(_Strict):
    """POST /v1/responses. `model` is accepted and ignored (the server runs one model)."""

    input: str | list[Any]
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None  # function tools are offered; others are not (convert)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    stream: bool = False
    # accepted, not acted on (what the official clients and the Agents SDK send)
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    stream_options: dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    client_metadata: dict[str, Any] | None = None  # Codex sends it on every request
    prompt_cache_retention: str | None = None
    max_tool_calls: int | None = None
    # server-side state turnstile does not hold: a value is a 400 naming the field
    conversation: Any = None
    prompt: Any = None
    # llama-server's extensions, as on chat completions
    timings_per_token: bool = False  # streamed deltas carry `timings` so far
    return_progress: bool = False  # streamed `response.in_progress` events with `prompt_progress`
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    speculative: str | None = None  # "ngram" | "none" (`runtime.serve.http.speculation`)
    speculative_n_max: int | None = msgspec.field(default=None, name="speculative.n_max")  # llama-server's: 0 off
