"""From an OpenAI chat request to `Runtime.complete`'s arguments, and from a `Reply` to OpenAI's bodies.

Sampling fields map one to one (`max_completion_tokens` wins over `max_tokens`; a single `stop` string
becomes a list). `tools`, `tool_choice` and `response_format` are passed only when the request has them
(`{"type": "json_object"}` becomes `"json"`, `{"type": "json_schema", ...}` its schema dict); a Reply
with `tool_calls` becomes an assistant message with JSON-encoded arguments and finish reason "tool_calls".
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.reply import Reply, TokenProb
from runtime.serve.http.chat.schema import (
    ChatChoice,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    FunctionCall,
    PromptDetails,
    ResponseMessage,
    ToolCall,
    Usage,
)
from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.fields import REFUSED, refuse_unsupported
from runtime.serve.http.llama.options import SYSTEM_FINGERPRINT
from runtime.serve.http.llama.probs import probs_json, trim_stop
from runtime.serve.http.llama.sampler_fields import FIELDS, sampler_options
from runtime.serve.http.speculation import speculative_option
from runtime.serve.http.tolerance import not_offered
from sessions.sampler_settings import MAX_N_PROBS

__all__ = ["Call", "from_request", "response", "timings", "tool_calls", "usage"]

_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "ignore_eos",
)


@dataclass
class Call:
    """What one request asks of the Runtime."""

    messages: list[dict[str, Any]]
    kwargs: dict[str, Any] = field(default_factory=dict)  # sampling, tools, tool_choice, response_format
    session_id: str | None = None
    stream: bool = False
    include_usage: bool = False
    top_logprobs: int | None = None  # logprobs asked: how many of each token's most probable to show
    post_sampling_probs: bool = False
    logit_bias: Any = None  # as given (the endpoint resolves it against the vocabulary)
    stop_tokens: dict[str, int] = field(default_factory=dict)  # each stop string's token count (probabilities)
    timings_per_token: bool = False  # llama-server's: each streamed chunk has the timings so far
    return_progress: bool = False  # llama-server's: streamed prompt-progress chunks


def _content(m: ChatMessage, i: int) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    texts: list[str] = []
    for part in m.content:
        if part.type != "text" or part.text is None:
            raise ApiError.bad_request(
                f"messages[{i}].content: only text parts are supported, not {part.type!r}", param="messages"
            )
        texts.append(part.text)
    return "".join(texts)


def _message(m: ChatMessage, i: int) -> dict[str, Any]:
    role = "system" if m.role == "developer" else m.role
    out: dict[str, Any] = {"role": role, "content": _content(m, i)}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None and role == "tool":
        out["name"] = m.name
    if m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content
    return out


def _response_format(value: dict[str, Any]) -> str | dict[str, Any] | None:
    kind = value.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":  # llama-server's extension: a "schema" beside it constrains to that schema
        schema = value.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise ApiError.bad_request("response_format.schema must be an object", param="response_format")
        return schema if schema else "json"
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError.bad_request("response_format.json_schema.schema must be an object", param="response_format")
        return schema
    raise ApiError.bad_request(f"response_format type {kind!r} is not supported", param="response_format")


def _llama_constraint(req: ChatRequest, extras: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `grammar` (GBNF) or top-level `json_schema`; one constraint per request."""
    given = [n for n in ("grammar", "json_schema") if getattr(req, n) not in (None, "", {})]
    if not given:
        return {}
    taken = [*given, *(n for n in ("response_format", "tools") if n in extras)]
    if len(taken) > 1:
        raise ApiError.bad_request(f"give one of {', '.join(taken)}, not several", param=taken[1])
    if req.grammar not in (None, ""):
        return {"grammar": req.grammar}
    return {"response_format": req.json_schema}


def _reasoning(req: ChatRequest) -> dict[str, Any]:
    """The turn's reasoning controls from llama-server's request fields (`reasoning_effort` "none": thinking
    off; another level goes to the template as its `reasoning_effort` variable)."""
    kw: dict[str, Any] = {}
    if req.reasoning_format is not None:
        kw["reasoning_format"] = "none" if req.reasoning_format == "none" else "auto"
    variables = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        if req.reasoning_effort == "none":
            kw["reasoning"] = "off"
        else:
            variables.setdefault("reasoning_effort", req.reasoning_effort)
    if variables:
        kw["chat_template_kwargs"] = variables
    budget = req.reasoning_budget_tokens if req.reasoning_budget_tokens is not None else req.thinking_budget_tokens
    if budget is not None and budget != -1:  # -1: no limit (the default); other negatives are refused (400)
        kw["reasoning_budget"] = budget
    if req.reasoning_budget_message is not None:
        kw["reasoning_budget_message"] = req.reasoning_budget_message
    return kw


def _function_call(value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """The deprecated `function_call` as a `tool_choice`."""
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    return value


def _offered(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools; the others (custom grammars, server tools …) are not offered (one warning)."""
    offered = [t for t in tools if t.get("type", "function") == "function"]
    others = [t for t in tools if t.get("type", "function") != "function"]
    not_offered("chat", (str(t.get("type")) for t in others))
    return offered


def from_request(req: ChatRequest, session_header: str | None) -> Call:
    """The Runtime call for a decoded request; ApiError(400) for what the API refuses itself."""
    refuse_unsupported({name: getattr(req, name) for name in REFUSED if hasattr(req, name)})
    if not req.messages:
        raise ApiError.bad_request("messages must be a non-empty list", param="messages")
    kw: dict[str, Any] = {name: getattr(req, name) for name in _SAMPLING if getattr(req, name) is not None}
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if limit is not None:
        kw["max_tokens"] = limit
    if req.stop is not None:
        kw["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    kw.update(sampler_options({name: getattr(req, name) for name in FIELDS}))
    top = _logprobs(req, kw)
    kw.update(_reasoning(req))
    kw.update(speculative_option(req.speculative, req.speculative_n_max))
    if req.modalities is not None and any(m != "text" for m in req.modalities):
        raise ApiError.bad_request("only text output is supported (modalities)", param="modalities")
    extras: dict[str, Any] = {}
    tools = _offered(req.tools or []) or [{"type": "function", "function": f} for f in req.functions or []]
    choice = req.tool_choice if req.tools else _function_call(req.function_call)
    if tools:  # an empty list, or a tool_choice without tools, asks for nothing
        extras["tools"] = tools
        if choice is not None:
            extras["tool_choice"] = choice
        if req.parallel_tool_calls is not None:
            extras["parallel_tool_calls"] = req.parallel_tool_calls
    if req.response_format is not None:
        fmt = _response_format(req.response_format)
        if fmt is not None:
            extras["response_format"] = fmt
    extras.update(_llama_constraint(req, extras))
    return Call(
        messages=[_message(m, i) for i, m in enumerate(req.messages)],
        kwargs=kw | extras,
        session_id=session_header or req.user or None,
        stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        top_logprobs=top,
        post_sampling_probs=bool(kw.get("post_sampling_probs")),
        logit_bias=req.logit_bias or None,
        timings_per_token=req.timings_per_token,
        return_progress=req.return_progress,
    )


def _logprobs(req: ChatRequest, kw: dict[str, Any]) -> int | None:
    """OpenAI's `logprobs` / `top_logprobs` (llama-server's default 20 alternatives), or llama-server's `n_probs`:
    sets `n_probs` in `kw` and gives how many alternatives to show (None: no probabilities asked)."""
    if req.logprobs not in (None, False, True):
        raise ApiError.bad_request("'logprobs' must be a boolean", param="logprobs")
    top = req.top_logprobs
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_N_PROBS):
        raise ApiError.bad_request(f"'top_logprobs' must be an int in [0, {MAX_N_PROBS}]", param="top_logprobs")
    if req.logprobs:
        if req.stream and req.tools:
            raise ApiError.bad_request("logprobs is not supported with tools + stream", param="logprobs")
        shown = 20 if top is None else top
    elif top is not None:
        raise ApiError.bad_request("top_logprobs requires logprobs to be set to true", param="top_logprobs")
    elif req.n_probs not in (None, 0):
        n = req.n_probs
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_N_PROBS:
            raise ApiError.bad_request(f"'n_probs' must be an int in [0, {MAX_N_PROBS}]", param="n_probs")
        shown = n
    else:
        return None
    kw["n_probs"] = max(1, shown)
    return shown


# --- reply -----------------------------------------------------------------------------------------


def usage(reply: Reply) -> Usage:
    u = reply.usage
    return Usage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.generated_tokens,
        total_tokens=u.prompt_tokens + u.generated_tokens,
        prompt_tokens_details=PromptDetails(cached_tokens=u.cached_tokens),
    )


def timings(reply: Reply) -> dict[str, Any]:
    """llama-server's `timings` (cache_n, prompt_n, predicted_n, ms and rates), plus turnstile's cache source."""
    u, t = reply.usage, reply.timings
    prompt_ms, predicted_ms = t.prefill * 1000, t.decode * 1000
    return {
        "cache_n": u.cached_tokens,
        "prompt_n": u.prefilled_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / u.prefilled_tokens if u.prefilled_tokens else 0.0,
        "prompt_per_second": u.prefilled_tokens / t.prefill if t.prefill > 0 else 0.0,
        "predicted_n": u.generated_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / u.generated_tokens if u.generated_tokens else 0.0,
        "predicted_per_second": u.generated_tokens / t.decode if t.decode > 0 else 0.0,
        "queued_ms": t.queued * 1000,
        "ttft_ms": (t.queued + t.first_token) * 1000 if t.first_token is not None else None,
        "draft_n": u.draft_n,
        "draft_n_accepted": u.draft_n_accepted,
        "cache_source": reply.cache_source,
    }


def tool_calls(reply: Reply) -> list[ToolCall] | None:
    calls = getattr(reply, "tool_calls", None)
    if not calls:
        return None
    return [
        ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)))
        for c in calls
    ]


def finish_reason(reply: Reply) -> str:
    return "stop" if reply.finish_reason == "cancelled" else str(reply.finish_reason)


def logprobs(probs: Sequence[TokenProb], call: Call) -> dict[str, Any] | None:
    """A choice's `logprobs` (`{"content": [...]}`, llama-server's entries) when the call asked, else None."""
    if call.top_logprobs is None or not probs:
        return None
    return {"content": probs_json(probs, post=call.post_sampling_probs, top=call.top_logprobs)}


def _unstopped(reply: Reply, call: Call) -> Sequence[TokenProb]:
    """A whole reply's probabilities as llama-server gives them: less the stop string's tokens."""
    return trim_stop(reply.probs, call.stop_tokens.get(reply.stop_sequence or "", 0))


def response(reply: Reply, *, request_id: str, model: str, call: Call | None = None) -> ChatResponse:
    calls = tool_calls(reply)
    content = reply.text if reply.text or not calls else None
    return ChatResponse(
        id=request_id,
        created=int(time.time()),
        model=model,
        choices=[
            ChatChoice(
                index=0,
                message=ResponseMessage(
                    content=content, tool_calls=calls, reasoning_content=reply.reasoning or msgspec.UNSET
                ),
                finish_reason=finish_reason(reply),
                logprobs=logprobs(_unstopped(reply, call), call) if call is not None else None,
            )
        ],
        usage=usage(reply),
        timings=timings(reply),
        system_fingerprint=SYSTEM_FINGERPRINT,
    )
