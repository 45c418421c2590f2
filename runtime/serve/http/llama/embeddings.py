"""llama-server's embedding routes, through a second llama.cpp context on the chat model's weights
(`Runtime.embed`: made on first use; the chat slot's state is never touched):

    POST /embedding, /embeddings   {"content" | "input": P, "embd_normalize"?: 2}
                                   -> [{"index": i, "embedding": [[...]]}, ...] (one vector pooled, else one per token)
    POST /v1/embeddings            {"input": P, "encoding_format"?: "float" | "base64", "embd_normalize"?}
                                   -> OpenAI's {"object": "list", "data": [{"embedding", "index", "object"}], "model",
                                      "usage": {"prompt_tokens", "total_tokens"}}

`P` is a prompt as on /completion: a string, token ids, strings and ids mixed (one input), or a list of those
(one embedding each, in order). As llama-server: off unless `turnstile serve --embedding` (501
`not_supported_error` "… Start it with `--embeddings`"); `/v1/embeddings` with pooling `none` is a 400; an
empty input a 400; an input longer than the context the context-size error.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from starlette.routing import Route

from runtime.api import Runtime
from runtime.serve.http.errors import ApiError
from runtime.serve.http.llama.completion import _tokens
from runtime.serve.http.llama.completion_request import _is_int, _prompts
from runtime.serve.http.state import ServeState
from runtime.serve.http.template_routes import TemplateEndpoint

__all__ = ["NATIVE_PATHS", "OAI_PATH", "routes"]

NATIVE_PATHS = ("/embedding", "/embeddings")
OAI_PATH = "/v1/embeddings"


def _off() -> ApiError:
    return ApiError(
        501, "This server does not support embeddings. Start it with `--embeddings`", type="not_supported_error"
    )


async def _inputs(rt: Runtime, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
    """The inputs' tokens, and whether the request is OpenAI's (`input`; `content` is llama-server's own)."""
    if "input" in body:
        value, oai = body["input"], True
    elif "content" in body:
        value, oai = body["content"], False
    else:
        raise ApiError.bad_request('"input" or "content" must be provided')
    if value == "":
        raise ApiError.bad_request("Input content cannot be empty")
    if isinstance(value, list) and not value:
        raise ApiError.bad_request('"input" must not be empty')
    value = [_text_parts(v) for v in value] if isinstance(value, list) else _text_parts(value)
    try:
        prompts = _prompts(value)
    except ApiError:
        raise ApiError.bad_request("'input' must be a string, token ids, or a list of those", param="input") from None
    out = [(await _tokens(rt, p))[0] for p in prompts]
    if any(not t for t in out):
        raise ApiError.bad_request("Input content cannot be empty")
    return out, oai


def _text_parts(value: Any) -> Any:
    """An OpenAI content entry `{"content": [{"type": "text", "text": ...}, ...]}` as its texts joined (llama-server
    reads it so); anything else as it is (other part types are refused with the rest of a bad input)."""
    if isinstance(value, dict) and set(value) == {"content"} and isinstance(value["content"], list):
        parts = value["content"]
        if parts and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts
        ):
            return "".join(p["text"] for p in parts)
    return value


def _normalize(body: dict[str, Any]) -> int:
    value = body.get("embd_normalize", 2)
    if not _is_int(value):
        raise ApiError.bad_request("'embd_normalize' must be an integer", param="embd_normalize")
    return int(value)


def routes(state: ServeState, *, max_body_bytes: int) -> list[Route]:
    async def native(rt: Runtime, body: dict[str, Any]) -> Any:
        if not state.llama.embeddings:
            raise _off()
        inputs, _ = await _inputs(rt, body)
        vectors = await rt.embed(inputs, normalize=_normalize(body))
        return [{"index": i, "embedding": v} for i, v in enumerate(vectors)]

    async def oai(rt: Runtime, body: dict[str, Any]) -> Any:
        if not state.llama.embeddings:
            raise _off()
        if await rt.embedding_pooling() == "none":
            raise ApiError.bad_request("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise ApiError.bad_request("The format to return the embeddings in. Can be either float or base64")
        inputs, is_oai = await _inputs(rt, body)
        vectors = await rt.embed(inputs, normalize=_normalize(body))
        if not is_oai:  # `content` is not OpenAI's: llama-server answers in its own shape
            return [{"index": i, "embedding": v} for i, v in enumerate(vectors)]
        data: list[dict[str, Any]] = []
        for i, v in enumerate(vectors):
            if fmt == "base64":
                raw = struct.pack(f"<{len(v[0])}f", *v[0])
                data.append(
                    {
                        "embedding": base64.b64encode(raw).decode(),
                        "index": i,
                        "object": "embedding",
                        "encoding_format": "base64",
                    }
                )
            else:
                data.append({"embedding": v[0], "index": i, "object": "embedding"})
        n = sum(len(t) for t in inputs)
        model = body.get("model") if isinstance(body.get("model"), str) else state.model
        return {"model": model, "object": "list", "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data}

    native_endpoint = TemplateEndpoint(state, native, max_body_bytes=max_body_bytes)
    return [
        *(Route(p, native_endpoint, methods=["POST"]) for p in NATIVE_PATHS),
        Route(OAI_PATH, TemplateEndpoint(state, oai, max_body_bytes=max_body_bytes), methods=["POST"]),
    ]
