"""The bodies of the OpenAI-compatible API as msgspec Structs: the chat completion request, its reply,
its stream chunks, the model list and the error object.

Decoding a request checks every known field's type (a wrong type is a 400); unknown fields are ignored,
as OpenAI's clients send more than a server needs. Conversion to the Runtime's arguments is in
`runtime.serve.http.chat.convert`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "ChatChoice",
    "ChatMessage",
    "ChatRequest",
    "ChatResponse",
    "Chunk",
    "ChunkChoice",
    "ContentPart",
    "Delta",
    "ErrorBody",
    "ErrorResponse",
    "FunctionCall",
    "ModelCard",
    "ModelList",
    "PromptDetails",
    "ResponseMessage",
    "StreamOptions",
    "ToolCall",
    "Usage",
]


# --- request ---------------------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content; only text parts are understood."""

    type: str
    text: str | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    """A function call in OpenAI's shape: `arguments` is a JSON-encoded object."""

    name: str
    arguments: str = "{}"


class ToolCall(msgspec.Struct, kw_only=True):
    """A tool call of an assistant message (in a request's history or in a reply)."""

    id: str
    function: FunctionCall
    type: str = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    """A message of a request: system (or developer), user, assistant or tool."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant message's reasoning, given back to the template


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class ChatRequest(msgspec.Struct, kw_only=True):
    """POST /v1/chat/completions. `model` is accepted and ignored (the server runs one model)."""

    messages: list[ChatMessage]
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    ignore_eos: bool | None = None  # llama-server's extension: generate until max_tokens
    n: int | None = None
    user: str | None = None
    modalities: list[str] | None = None  # only ["text"] can be honoured (a 400 otherwise)
    functions: list[dict[str, Any]] | None = None  # the deprecated form of `tools` (used when tools are absent)
    function_call: str | dict[str, Any] | None = None  # the deprecated form of `tool_choice`
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # thinking models, as llama-server: "none" keeps the reasoning in the content, "auto" / "deepseek" split it
    reasoning_format: Literal["none", "auto", "deepseek"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # "none" turns thinking off; other levels go to the template
    reasoning_budget_tokens: int | None = None  # llama-server's: -1 no limit, 0 close at once, N tokens
    thinking_budget_tokens: int | None = None  # its older name
    reasoning_budget_message: str | None = None
    speculative: str | None = None  # "ngram" | "none" (`runtime.serve.http.speculation`)
    speculative_n_max: int | None = msgspec.field(default=None, name="speculative.n_max")  # llama-server's: 0 off
    # llama-server's constraints: a GBNF grammar or a JSON schema (at most one, and not with response_format)
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # probabilities and llama-server's sampler fields (runtime.serve.http.llama.sampler_fields); any JSON value
    # decodes so that a refusal names the field
    logit_bias: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    n_probs: Any = None
    post_sampling_probs: Any = None
    typical_p: Any = None
    min_keep: Any = None
    top_n_sigma: Any = None
    xtc_probability: Any = None
    xtc_threshold: Any = None
    dynatemp_range: Any = None
    dynatemp_exponent: Any = None
    mirostat: Any = None
    mirostat_tau: Any = None
    mirostat_eta: Any = None
    dry_multiplier: Any = None
    dry_base: Any = None
    dry_allowed_length: Any = None
    dry_penalty_last_n: Any = None
    dry_sequence_breakers: Any = None
    samplers: Any = None
    timings_per_token: bool = False  # each streamed chunk carries `timings` (llama-server's)
    return_progress: bool = False  # streamed prompt-progress chunks before the first token (llama-server's)
    # fields that change the reply and that turnstile does not do: refused (400) unless neutral
    # (runtime.serve.http.llama.fields)
    n_indent: Any = None
    lora: Any = None


# --- reply -----------------------------------------------------------------------------------------


class PromptDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class Usage(msgspec.Struct, kw_only=True):
    """OpenAI's usage; `prompt_tokens_details.cached_tokens` is turnstile's `cached_tokens`."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails


class ResponseMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | msgspec.UnsetType = msgspec.UNSET  # left out when the reply has no reasoning


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ResponseMessage
    finish_reason: str
    logprobs: dict[str, Any] | None = None


class ChatResponse(msgspec.Struct, kw_only=True):
    """A chat completion, with llama-server's `timings` beside OpenAI's fields."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: dict[str, Any]
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class FunctionDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed piece of a function call: the name in the call's first chunk, then arguments text."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A streamed piece of a tool call, OpenAI's `delta.tool_calls[]`: the first chunk of a call has `id`,
    `type` and `function.name` (arguments ""), the next ones only `index` and `function.arguments`."""

    index: int
    function: FunctionDelta
    id: str | None = None
    type: str | None = None


class Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | msgspec.UnsetType | None = msgspec.UNSET  # None: `"content": null` (the role-only chunk)
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class Chunk(msgspec.Struct, kw_only=True):
    """One `data:` event of a stream; the last one (with include_usage) has no choices and the usage."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None = None
    timings: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # left out where llama-server leaves it out
    system_fingerprint: str | None = None
    prompt_progress: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # llama-server's return_progress


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    created: int
    owned_by: str = "turnstile"
    object: Literal["model"] = "model"
    meta: dict[str, Any] | None = None


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelCard]
    object: Literal["list"] = "list"


class ErrorBody(msgspec.Struct, kw_only=True):
    message: str
    type: str
    code: str | None = None
    param: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """OpenAI's error shape: `{"error": {"message", "type", "code", "param"}}`."""

    error: ErrorBody
