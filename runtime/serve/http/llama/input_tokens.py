"""llama-server's `POST /chat/completions/input_tokens` (and under `/v1`): the prompt's token count for a chat
request, without running it: `{"input_tokens": N, "object": "response.input_tokens"}` (`Runtime.count_tokens`:
the chat template's render with the tools offered, tokenized as a turn's prompt)."""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from runtime.api import Runtime
from runtime.serve.http.errors import ApiError
from runtime.serve.http.state import ServeState
from runtime.serve.http.template_routes import TemplateEndpoint

__all__ = ["PATHS", "routes"]

PATHS = ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens")


async def count(rt: Runtime, body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError.bad_request("'messages' must be a non-empty array", param="messages")
    tools = body.get("tools")
    n = await rt.count_tokens(messages, **({"tools": tools} if tools else {}))
    return {"input_tokens": n, "object": "response.input_tokens"}


def routes(state: ServeState, *, max_body_bytes: int) -> list[Route]:
    endpoint = TemplateEndpoint(state, count, max_body_bytes=max_body_bytes)
    return [Route(p, endpoint, methods=["POST"]) for p in PATHS]
