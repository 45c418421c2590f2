"""GET /openapi.json: the server's routes as an OpenAPI 3.1 document, written from the msgspec Structs the
endpoints decode and encode (`msgspec.json.schema_components`), so the document cannot drift from them.

Request bodies are the decoders' own types (ChatRequest, MessagesRequest, CountRequest, ResponsesRequest);
answers are the Structs the server encodes where it has one (ChatResponse, ModelList), else an object.
Every error answer is the dialect's error shape: OpenAI's `{"error": {...}}` everywhere but /v1/messages,
whose errors are Anthropic's `{"type": "error", "error": {"type", "message"}}`. Links say how one
answer feeds the next request, which a stateful fuzzer (Schemathesis) follows:

- a session: POST /v1/sessions (201, its `id`) -> a turn in it (chat completions or Messages with that id as
  `X-Session-Id`) -> its history (GET /v1/sessions/{id}, export, undo) or DELETE; a turn's `X-Session-Id`
  -> the same history and DELETE;
- a response: POST /v1/responses (its `id`) -> GET / DELETE /v1/responses/{id}, its input items, and the next
  POST /v1/responses with `previous_response_id` = that id (whose own id links on in turn).

A link that starts a turn carries a small valid body (the fuzzer's own bodies are mostly refused before any
state is made); session ids in paths and bodies are described by their pattern, so generated ones are valid
ids more often than not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

from runtime.serve.http.chat.schema import ChatResponse, ErrorResponse, ModelList
from runtime.serve.http.messages.convert import CountRequest, MessagesRequest
from runtime.serve.http.responses.schema import ResponsesRequest

__all__ = ["AnthropicError", "document"]


class AnthropicErrorBody(msgspec.Struct, kw_only=True):
    type: str
    message: str


class AnthropicError(msgspec.Struct, kw_only=True):
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`."""

    type: str
    error: AnthropicErrorBody


_TYPES: tuple[type[msgspec.Struct], ...] = (
    MessagesRequest,
    CountRequest,
    ResponsesRequest,
    ChatResponse,
    ModelList,
    ErrorResponse,
    AnthropicError,
)
_REF = "#/components/schemas/{name}"


def _ref(t: type) -> dict[str, str]:
    return {"$ref": _REF.format(name=t.__name__)}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"}},
}


def _answers(ok: dict[str, Any], *, anthropic: bool = False, stream: bool = False) -> dict[str, Any]:
    error = {
        "description": "an error in the dialect's shape",
        "content": _json(_ref(AnthropicError if anthropic else ErrorResponse)),
    }
    content = _json(ok)
    if stream:  # each server-sent event (what a client parses: its `event` name and `data` text)
        content["text/event-stream"] = {"schema": _EVENT}
    out: dict[str, Any] = {"200": {"description": "OK", "content": content}}
    for status in ("400", "401", "404", "409", "413", "429", "503", "504"):
        out[status] = error
    return out


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": _json(schema)}


_SESSION_ID: dict[str, Any] = {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,64}$"}
_SESSION_HEADER = {
    "name": "X-Session-Id",
    "in": "header",
    "required": False,
    "description": "names a session of the key: its requests run in order and its transcript is kept",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:@-]{1,100}$"},
}
_OBJECT: dict[str, Any] = {"type": "object"}
_SESSION = "#/components/schemas/SessionObject"
_SESSION_OBJECT: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "object": {"type": "string"}, "revision": {"type": "integer"}},
    "required": ["id", "object"],
}
_NEW_SESSION: dict[str, Any] = {
    "type": "object",
    "properties": {"id": _SESSION_ID, "system": {"type": "string", "maxLength": 200}},
    "required": ["id"],
}
# a turn the links start: valid, short (the fuzzer's own bodies mostly fail validation before any state exists)
_CHAT_TURN = {"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 4}
_MESSAGES_TURN = {"model": "any", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello."}]}


def _path_param(name: str) -> dict[str, Any]:
    schema = _SESSION_ID if name == "session_id" else {"type": "string"}
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _session_links(session_id: str, *, turns: bool) -> dict[str, Any]:
    """Links from an answer that names a session (`session_id`: the runtime expression of its id)."""
    param = {"session_id": session_id}
    links: dict[str, Any] = {
        "GetSession": {"operationId": "getSession", "parameters": param},
        "ExportSession": {"operationId": "exportSession", "parameters": param},
        "UndoSession": {"operationId": "undoSession", "parameters": param, "requestBody": {"n": 1}},
        "DeleteSession": {"operationId": "deleteSession", "parameters": param},
    }
    if turns:
        header = {"header.X-Session-Id": session_id}
        links["ChatInSession"] = {
            "operationId": "createChatCompletion",
            "parameters": header,
            "requestBody": _CHAT_TURN,
        }
        links["MessageInSession"] = {
            "operationId": "createMessage",
            "parameters": header,
            "requestBody": _MESSAGES_TURN,
        }
    return links


def document(
    chat_request: type[msgspec.Struct], routes: Iterable[tuple[str, str]] = (), title: str = "turnstile"
) -> dict[str, Any]:
    """The OpenAPI document (`chat_request`: the chat completions request type the endpoint decodes).

    `routes`: every (path, method) the app serves; those this module does not describe (the web page's, say)
    are listed as generic operations (any body, any answer, errors in OpenAI's shape), so none is missing."""
    (chat_schema, *_), components = msgspec.json.schema_components((chat_request, *_TYPES), ref_template=_REF)
    session_links = _session_links("$request.header.X-Session-Id", turns=False)
    created = _answers({"$ref": _REF.format(name="ResponseObject")}, stream=True)
    created["200"]["links"] = {
        "GetResponse": {"operationId": "getResponse", "parameters": {"response_id": "$response.body#/id"}},
        "GetInputItems": {"operationId": "getInputItems", "parameters": {"response_id": "$response.body#/id"}},
        "DeleteResponse": {"operationId": "deleteResponse", "parameters": {"response_id": "$response.body#/id"}},
        "ContinueResponse": {
            "operationId": "createResponse",
            "requestBody": {"input": "next", "previous_response_id": "$response.body#/id"},
        },
    }
    chat = _answers(_ref(ChatResponse), stream=True)
    chat["200"]["links"] = session_links
    messages = _answers(_OBJECT, anthropic=True, stream=True)
    messages["200"]["links"] = session_links
    components["SessionObject"] = _SESSION_OBJECT
    created_session = _answers({"$ref": _SESSION})
    created_session["201"] = created_session.pop("200") | {"links": _session_links("$response.body#/id", turns=True)}
    components["ResponseObject"] = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "object": {"type": "string"}},
        "required": ["id", "object"],
    }
    paths: dict[str, Any] = {
        "/v1/chat/completions": {
            "post": {
                "operationId": "createChatCompletion",
                "parameters": [_SESSION_HEADER],
                "requestBody": _body(chat_schema),
                "responses": chat,
            }
        },
        "/v1/messages": {
            "post": {
                "operationId": "createMessage",
                "parameters": [_SESSION_HEADER],
                "requestBody": _body(_ref(MessagesRequest)),
                "responses": messages,
            }
        },
        "/v1/messages/count_tokens": {
            "post": {
                "operationId": "countTokens",
                "requestBody": _body(_ref(CountRequest)),
                "responses": _answers(
                    {"type": "object", "properties": {"input_tokens": {"type": "integer"}}}, anthropic=True
                ),
            }
        },
        "/v1/responses": {
            "post": {
                "operationId": "createResponse",
                "requestBody": _body(_ref(ResponsesRequest)),
                "responses": created,
            }
        },
        "/v1/responses/{response_id}": {
            "parameters": [_path_param("response_id")],
            "get": {"operationId": "getResponse", "responses": _answers({"$ref": _REF.format(name="ResponseObject")})},
            "delete": {"operationId": "deleteResponse", "responses": _answers(_OBJECT)},
        },
        "/v1/responses/{response_id}/input_items": {
            "parameters": [_path_param("response_id")],
            "get": {"operationId": "getInputItems", "responses": _answers(_OBJECT)},
        },
        "/v1/sessions": {
            "get": {"operationId": "listSessions", "responses": _answers(_OBJECT)},
            "post": {
                "operationId": "createSession",
                "requestBody": _body(_NEW_SESSION),
                "responses": created_session,
            },
        },
        "/v1/sessions/{session_id}": {
            "parameters": [_path_param("session_id")],
            "get": {"operationId": "getSession", "responses": _answers({"$ref": _SESSION})},
            "delete": {"operationId": "deleteSession", "responses": _answers(_OBJECT)},
        },
        "/v1/sessions/{session_id}/export": {
            "parameters": [_path_param("session_id")],
            "get": {"operationId": "exportSession", "responses": _answers(_OBJECT)},
        },
        "/v1/sessions/{session_id}/undo": {
            "parameters": [_path_param("session_id")],
            "post": {
                "operationId": "undoSession",
                "requestBody": _body({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}),
                "responses": _answers({"$ref": _SESSION}),
            },
        },
        "/v1/models": {"get": {"operationId": "listModels", "responses": _answers(_ref(ModelList))}},
        "/health": {"get": {"operationId": "health", "security": [], "responses": _answers(_OBJECT)}},
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "responses": _answers({"type": "string"})
                | {
                    "200": {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
                },
            }
        },
        "/openapi.json": {"get": {"operationId": "openapi", "security": [], "responses": _answers(_OBJECT)}},
    }
    for path, op in (("/apply-template", "applyTemplate"), ("/tokenize", "tokenize"), ("/detokenize", "detokenize")):
        paths[path] = {"post": {"operationId": op, "requestBody": _body(_OBJECT), "responses": _answers(_OBJECT)}}
    for path, method in routes:
        op = method.lower()
        if op in paths.get(path, {}):
            continue
        params = [_path_param(name) for name in re.findall(r"{(\w+)}", path)]
        generic: dict[str, Any] = {
            "operationId": op + re.sub(r"[^A-Za-z0-9]+", "_", path).rstrip("_"),
            "responses": _answers(_OBJECT) | {"200": {"description": "OK", "content": {"*/*": {}}}},
        }
        if params:
            generic["parameters"] = params
        if op in ("post", "put", "patch"):
            generic["requestBody"] = {"required": False, "content": {"application/json": {"schema": _OBJECT}}}
        paths.setdefault(path, {})[op] = generic
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }
