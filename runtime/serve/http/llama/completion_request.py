"""llama-server's completion request (`/completion`, `/completions`, `/v1/completions`) read into a raw prompt
and `Runtime.complete_prompt`'s options.

`prompt` is a string, a list of token ids, a list mixing strings and ids (one prompt), llama-server's JSON prompt
`{"prompt_string": ...}` (no multimodal data), or a list of such prompts (several, answered in order).
Sampling fields map to turnstile's (`n_predict` or `max_tokens`, the request's winning over the server's;
-1: no limit; `seed` -1: random). `grammar` (GBNF), `json_schema` and `response_format` (`json_object` with or
without a `schema`, or `json_schema`) constrain the reply. Fields that would change the reply and that
turnstile does not do are refused with a 400 naming the field, never ignored; fields that change
nothing in the reply (cache_prompt, id_slot, return_progress, timings_per_token, ...) are accepted.
(`runtime.serve.http.llama.fields`)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.fields import refuse_unsupported
from runtime.serve.http.llama.sampler_fields import sampler_options
from sessions.sampler_settings import MAX_N_PROBS

__all__ = ["CompletionCall", "parse"]

Prompt = list[str | int]


_FLOATS = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")
_INTS = ("top_k", "repeat_last_n")


# the sampler settings `generation_settings` reports, with llama-server's defaults
_REPORTED = (
    ("typical_p", 1.0),
    ("mirostat", 0),
    ("mirostat_tau", 5.0),
    ("mirostat_eta", 0.1),
    ("dry_multiplier", 0.0),
    ("dry_base", 1.75),
    ("dry_allowed_length", 2),
    ("dry_penalty_last_n", 64),
    ("xtc_probability", 0.0),
    ("xtc_threshold", 0.1),
    ("dynatemp_range", 0.0),
    ("dynatemp_exponent", 1.0),
    ("top_n_sigma", -1.0),
    ("min_keep", 0),
    ("n_probs", 0),
    ("post_sampling_probs", False),
)


@dataclass
class CompletionCall:
    prompts: list[Prompt]
    options: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    return_tokens: bool = False
    echo: bool = False
    include_usage: bool = False
    settings: dict[str, Any] = field(default_factory=dict)  # what `generation_settings` reports
    logit_bias: Any = None  # the request's logit_bias as given (resolved against the vocabulary by the endpoint)
    timings_per_token: bool = False  # each streamed event carries `timings` (llama-server's)
    return_progress: bool = False  # a streamed prompt's progress events before the first token (llama-server's)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _prompts(value: Any) -> list[Prompt]:
    if isinstance(value, str):
        return [[value]]
    if isinstance(value, dict) and isinstance(value.get("prompt_string"), str) and set(value) == {"prompt_string"}:
        return [[value["prompt_string"]]]  # llama-server's JSON prompt, without multimodal data
    if isinstance(value, list) and value:
        if all(isinstance(p, str) or _is_int(p) for p in value):
            if all(isinstance(p, str) for p in value) and len(value) > 1:
                return [[p] for p in value]  # several string prompts
            return [list(value)]
        if all(isinstance(p, list | str | dict) for p in value):
            out: list[Prompt] = []
            for p in value:
                out += _prompts(p)
            return out
    raise ApiError.bad_request(
        "'prompt' must be a string, a list of token ids (or strings and ids), or a list of prompts", param="prompt"
    )


def _number(body: dict[str, Any], name: str, kind: type) -> Any:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not _is_int(v)):
        raise ApiError.bad_request(f"{name!r} must be a {'number' if kind is float else 'integer'}", param=name)
    return kind(v)


def _constraint(body: dict[str, Any]) -> dict[str, Any]:
    given = [n for n in ("grammar", "json_schema", "response_format") if body.get(n) not in (None, "", {})]
    if len(given) > 1:
        raise ApiError.bad_request(f"give one of {', '.join(given)}, not several", param=given[1])
    if not given:
        return {}
    name, value = given[0], body[given[0]]
    if name == "grammar":
        if not isinstance(value, str):
            raise ApiError.bad_request("'grammar' must be a GBNF string", param="grammar")
        return {"grammar": value}
    if name == "json_schema":
        if not isinstance(value, dict):
            raise ApiError.bad_request("'json_schema' must be an object", param="json_schema")
        return {"response_format": value}
    if not isinstance(value, dict):
        raise ApiError.bad_request("'response_format' must be an object", param="response_format")
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        schema = value.get("schema")
        return {"response_format": schema if isinstance(schema, dict) else "json"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError.bad_request("response_format.json_schema.schema must be an object", param="response_format")
        return {"response_format": schema}
    raise ApiError.bad_request(f"response_format type {kind!r} is not supported", param="response_format")


def parse(body: dict[str, Any], defaults: dict[str, Any], *, oai: bool) -> CompletionCall:
    """The call for a decoded request body (ApiError 400 for what is refused)."""
    refuse_unsupported(body)
    if body.get("suffix") not in (None, ""):
        raise ApiError.bad_request("'suffix' is not supported by turnstile (use /infill)", param="suffix")
    if "prompt" not in body:
        raise ApiError.bad_request("'prompt' is required", param="prompt")
    opts: dict[str, Any] = {}
    for name in _FLOATS:
        if (v := _number(body, name, float)) is not None:
            opts[name] = v
    for name in _INTS:
        if (v := _number(body, name, int)) is not None:
            opts[name] = v
    seed = _number(body, "seed", int)
    if seed is not None and seed >= 0:
        opts["seed"] = seed
    limit = _number(body, "max_tokens" if oai and "max_tokens" in body else "n_predict", int)
    if limit is None:
        limit = _number(body, "max_tokens", int)
    if limit is not None and limit >= 0:
        opts["max_tokens"] = limit
    elif limit is not None and limit < -1:
        raise ApiError.bad_request("'n_predict' must be -1 (no limit) or a number of tokens", param="n_predict")
    opts.update(sampler_options(body))
    probs_field = "n_probs" if "n_probs" in body else "logprobs"
    n_probs = _number(body, probs_field, int)
    if n_probs is not None and not 0 <= n_probs <= MAX_N_PROBS:
        raise ApiError.bad_request(f"{probs_field!r} must be in [0, {MAX_N_PROBS}]", param=probs_field)
    if n_probs:
        opts["n_probs"] = n_probs
    if "ignore_eos" in body:
        if not isinstance(body["ignore_eos"], bool):
            raise ApiError.bad_request("'ignore_eos' must be a boolean", param="ignore_eos")
        opts["ignore_eos"] = body["ignore_eos"]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ApiError.bad_request("'stop' must be a string or a list of strings", param="stop")
        if stops:
            opts["stop"] = stops
    merged = {**defaults, **opts}  # the request's n_predict wins over the server's (llama-server's n_predict_max)
    merged.update(_constraint(body))
    for flag in ("stream", "return_tokens", "echo", "timings_per_token", "return_progress"):
        if flag in body and not isinstance(body[flag], bool):
            raise ApiError.bad_request(f"{flag!r} must be a boolean", param=flag)
    id_slot = body.get("id_slot")
    if id_slot is not None and id_slot not in (-1, 0):
        raise ApiError.bad_request("turnstile has one slot: 'id_slot' must be -1 or 0", param="id_slot")
    options = body.get("stream_options")
    settings = {
        "n_predict": merged.get("max_tokens", -1),
        "seed": merged.get("seed", defaults.get("seed", -1)),
        "temperature": merged.get("temperature", 0.8),
        "top_k": merged.get("top_k", 40),
        "top_p": merged.get("top_p", 0.95),
        "min_p": merged.get("min_p", 0.05),
        "repeat_penalty": merged.get("repeat_penalty", 1.0),
        "repeat_last_n": merged.get("repeat_last_n", 64),
        "presence_penalty": merged.get("presence_penalty", 0.0),
        "frequency_penalty": merged.get("frequency_penalty", 0.0),
        "ignore_eos": merged.get("ignore_eos", False),
        "stop": merged.get("stop", []),
        **{name: merged.get(name, default) for name, default in _REPORTED},
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "grammar": merged.get("grammar", ""),
        "stream": bool(body.get("stream", False)),
    }
    return CompletionCall(
        prompts=_prompts(body["prompt"]),
        options=merged,
        stream=bool(body.get("stream", False)),
        return_tokens=bool(body.get("return_tokens", False)),
        echo=bool(body.get("echo", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        settings=settings,
        logit_bias=body.get("logit_bias") or None,
        timings_per_token=bool(body.get("timings_per_token", False)),
        return_progress=bool(body.get("return_progress", False)),
    )
