"""llama-server's template and tokenizer endpoints, same request and response shapes:

    POST /apply-template   {"messages": [...], "tools"?, "add_generation_prompt"?, "chat_template_kwargs"?}
                           -> {"prompt": "..."}   (the model's chat template, exactly as llama-server renders it)
    POST /tokenize         {"content": "..." | [str | int, ...], "add_special"?: false, "parse_special"?: true,
                            "with_pieces"?: false} -> {"tokens": [id, ...]} or [{"id", "piece"}, ...]
    POST /detokenize       {"tokens": [id, ...]} -> {"content": "..."}

A piece is the token's text, or the list of its byte values when those are not valid UTF-8 (as llama-server).
A mixed `content` list tokenizes its strings (special tokens added only before the first) and keeps its ids.
Bad input (wrong types, ids outside the vocabulary, a template that refuses the conversation) is a 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.routing import Route

from runtime.api import Runtime
from runtime.serve.http.endpoint import ClientGone, read_body, send_bytes, send_error
from runtime.serve.http.errors import ApiError, to_api_error
from runtime.serve.http.state import ServeState

__all__ = ["PATHS", "TemplateEndpoint", "apply_template", "detokenize", "routes", "tokenize"]

Scope = dict[str, Any]
Handler = Callable[[Runtime, dict[str, Any]], Awaitable[Any]]

_decoder = msgspec.json.Decoder()


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError.bad_request(f"{name!r} must be a boolean", param=name)
    return value


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def apply_template(rt: Runtime, body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ApiError.bad_request("'messages' is required: a list of messages", param="messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError.bad_request("'tools' must be a list of tool definitions", param="tools")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ApiError.bad_request("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    gen = _flag(body, "add_generation_prompt", True)
    prompt = await rt.apply_template(messages, tools=tools, add_generation_prompt=gen, chat_template_kwargs=kwargs)
    return {"prompt": prompt}


async def tokenize(rt: Runtime, body: dict[str, Any]) -> dict[str, Any]:
    if "content" not in body:
        return {"tokens": []}
    content = body["content"]
    add_special = _flag(body, "add_special", False)
    parse_special = _flag(body, "parse_special", True)
    with_pieces = _flag(body, "with_pieces", False)
    parts = [content] if isinstance(content, str) else content
    if not isinstance(parts, list) or not all(isinstance(p, str) or _int(p) for p in parts):
        raise ApiError.bad_request("'content' must be a string or a list of strings and token ids", param="content")
    tokens: list[int] = []
    for i, p in enumerate(parts):
        if isinstance(p, str):
            tokens += await rt.tokenize(p, add_special=add_special and i == 0, parse_special=parse_special)
        else:
            await rt.token_pieces([p])  # an id outside the vocabulary is a 400
            tokens.append(p)
    if not with_pieces:
        return {"tokens": tokens}
    out: list[Any] = []
    for t, raw in zip(tokens, await rt.token_pieces(tokens), strict=True):
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return {"tokens": out}


async def detokenize(rt: Runtime, body: dict[str, Any]) -> dict[str, Any]:
    tokens = body.get("tokens", [])
    if not isinstance(tokens, list) or not all(_int(t) for t in tokens):
        raise ApiError.bad_request("'tokens' must be a list of token ids", param="tokens")
    return {"content": b"".join(await rt.token_pieces(tokens)).decode("utf-8", "replace")}


class TemplateEndpoint:
    """One of the routes above, as an ASGI app (the body limit and error answers of the chat endpoint)."""

    def __init__(self, state: ServeState, handler: Handler, *, max_body_bytes: int) -> None:
        self.state = state
        self.handler = handler
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        try:
            raw = await read_body(scope, receive, self.max_body_bytes)
            body = _decoder.decode(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise ApiError.bad_request("the request body must be a JSON object")
            result = await self.handler(self.state.require(), body)
        except ClientGone:
            return
        except Exception as e:
            await send_error(send, to_api_error(e))
            return
        await send_bytes(send, 200, msgspec.json.encode(result))


_HANDLERS: dict[str, Handler] = {"/apply-template": apply_template, "/tokenize": tokenize, "/detokenize": detokenize}
PATHS = frozenset(_HANDLERS)


def routes(state: ServeState, *, max_body_bytes: int) -> list[Route]:
    """The three routes, for the app to mount."""
    return [
        Route(path, TemplateEndpoint(state, handler, max_body_bytes=max_body_bytes), methods=["POST"])
        for path, handler in _HANDLERS.items()
    ]
