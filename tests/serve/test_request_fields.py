"""Tolerance of what real clients send, against a real `turnstile serve` (a tiny Qwen-template model):

- every field of the official request schemas, enumerated from the `openai` and `anthropic` packages' type
  definitions (the TypedDicts of chat completions, Responses and Messages), each with a valid value, in one
  request per dialect: no 400 (a field the packages add and this table lacks fails the test, by name);
- unknown top-level fields are ignored and counted in /metrics by dialect and name;
- what coding agents send: `role: "system"` inside Messages' `messages`, `cache_control` everywhere, server
  and MCP tools (not offered), unknown block and item types (dropped), `propertyNames` in a tool's schema
  (accepted) but not in a response format (400), an image on a text-only model (400 in Anthropic's shape);
- the fields turnstile cannot honour and that would change the reply are a 400 naming them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from anthropic.types import message_create_params
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params

from tests.support.process import ServeProcess
from tests.support.tool_models import write_qwen

FN_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "env": {"type": "object", "propertyNames": {"pattern": "^[A-Z]+$"}}},
    "required": ["path"],
}
USER = "Say hi."

CHAT: dict[str, Any] = {
    "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": USER}]},
    ],
    "model": "local",
    "audio": None,
    "frequency_penalty": 0.0,
    "function_call": "auto",
    "functions": [{"name": "read", "description": "Read a file.", "parameters": FN_SCHEMA}],
    "logit_bias": {},
    "logprobs": False,
    "max_completion_tokens": 3,
    "max_tokens": 3,
    "metadata": {"task": "fields"},
    "modalities": ["text"],
    "moderation": {"model": "omni-moderation-latest", "policy": None},
    "n": 1,
    "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "hi"},
    "presence_penalty": 0.0,
    "prompt_cache_key": "fields-chat",
    "prompt_cache_retention": "in-memory",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "reasoning_effort": "low",
    "response_format": {"type": "text"},
    "safety_identifier": "someone",
    "seed": 1,
    "service_tier": "auto",
    "stop": ["\n\n\n"],
    "store": False,
    "stream": False,
    "stream_options": None,
    "temperature": 0.0,
    "tool_choice": "auto",
    "tools": [
        {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": FN_SCHEMA}},
        {"type": "custom", "custom": {"name": "apply_patch", "description": "Apply a patch."}},
    ],
    "top_logprobs": None,
    "top_p": 1.0,
    "user": "fields-user",
    "verbosity": "low",
    "web_search_options": {},
}

RESPONSES: dict[str, Any] = {
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "input_text", "text": USER}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}},
    ],
    "model": "local",
    "access_programs": {"cyber": "standard"},
    "background": False,
    "background_options": {"completion_window": "soonest"},
    "context_management": [{"type": "compaction", "compact_threshold": 100000}],
    "conversation": None,
    "image": {"context_compression": "auto"},
    "include": ["reasoning.encrypted_content"],
    "instructions": "You are a coding agent.",
    "max_output_tokens": 3,
    "max_tool_calls": 4,
    "metadata": {"task": "fields"},
    "moderation": {"model": "omni-moderation-latest", "policy": None},
    "parallel_tool_calls": False,
    "previous_response_id": None,
    "prompt": None,
    "prompt_cache_key": "fields-responses",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "reasoning": {"effort": "medium", "summary": "auto"},
    "safety_identifier": "someone",
    "service_tier": "auto",
    "store": False,
    "stream": False,
    "stream_options": None,
    "temperature": 0.0,
    "text": {"format": {"type": "text"}, "verbosity": "low"},
    "tool_choice": "auto",
    "tools": [
        {"type": "function", "name": "read", "description": "Read a file.", "parameters": FN_SCHEMA, "strict": False},
        {"type": "web_search", "external_web_access": False},
        {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
        {"type": "mcp", "server_label": "docs", "server_url": "https://example.invalid/mcp"},
        {"type": "namespace", "name": "mcp__docs", "tools": []},
    ],
    "top_logprobs": 0,
    "top_p": 1.0,
    "truncation": "disabled",
    "user": "someone",
    "client_metadata": {"x-codex-turn-metadata": "{}"},  # Codex's, not in the package's schema
}

MESSAGES: dict[str, Any] = {
    "max_tokens": 3,
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": USER, "cache_control": {"type": "ephemeral"}}]},
    ],
    "model": "claude-sonnet-4-5",
    "cache_control": {"type": "ephemeral"},
    "container": "container_1",
    "diagnostics": {"previous_message_id": "msg_1"},
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    "inference_geo": "us",
    "mcp_servers": [{"type": "url", "url": "https://example.invalid/mcp", "name": "docs"}],
    "metadata": {"user_id": "user_1"},
    "output_config": {"effort": "low"},
    "service_tier": "auto",
    "speed": "standard",
    "stop_sequences": ["\n\n\n"],
    "stream": False,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=00000;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ],
    "temperature": 0.0,
    "thinking": {"type": "disabled"},
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "tools": [
        {
            "name": "Read",
            "description": "Read a file.",
            "input_schema": FN_SCHEMA,
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 1},
        {"type": "bash_20250124", "name": "bash"},
    ],
    "top_k": 1,
    "top_p": 1.0,
    "user_profile_id": "up_1",
    "workspace_id": "wrkspc_1",
}


def keys(*typed: Any) -> set[str]:
    out: set[str] = set()
    for t in typed:
        out |= set(t.__required_keys__) | set(t.__optional_keys__)
    return out


@pytest.mark.parametrize(
    ("table", "typed"),
    [
        (CHAT, keys(completion_create_params.CompletionCreateParamsNonStreaming)),
        (RESPONSES, keys(response_create_params.ResponseCreateParamsNonStreaming)),
        (MESSAGES, keys(message_create_params.MessageCreateParamsNonStreaming)),
    ],
    ids=["chat", "responses", "messages"],
)
def test_the_tables_cover_every_official_field(table: dict[str, Any], typed: set[str]) -> None:
    assert typed - set(table) == set(), "fields the installed package declares and this test sends no value for"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    model = write_qwen(tmp_path_factory.mktemp("fields") / "qwen.gguf")
    with ServeProcess("--model", model, "--threads", "1", "--ctx", "2048") as srv:
        yield srv


def post(srv: ServeProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def test_every_official_field_is_accepted(server: ServeProcess) -> None:
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSES), ("/v1/messages", MESSAGES)):
        r = post(server, path, body)
        assert r.status_code == 200, (path, r.text)


def metric(text: str, api: str, field: str) -> int:
    m = re.search(rf'turnstile_http_ignored_fields_total{{api="{api}",field="{field}"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def test_unknown_top_level_fields_are_ignored_and_counted(server: ServeProcess) -> None:
    before = httpx.get(server.url + "/metrics").text
    small = {"max_tokens": 2, "temperature": 0}
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": USER}], **small}),
        ("/v1/responses", {"input": USER, "max_output_tokens": 2, "store": False}),
        ("/v1/messages", {"messages": [{"role": "user", "content": USER}], **small}),
    ):
        r = post(server, path, {**body, "x_future_field": {"a": 1}})
        assert r.status_code == 200, (path, r.text)
    after = httpx.get(server.url + "/metrics").text
    for api in ("chat", "responses", "messages"):
        assert metric(after, api, "x_future_field") == metric(before, api, "x_future_field") + 1
    assert metric(after, "messages", "container") >= 1  # undeclared official fields are counted too


def test_what_claude_code_sends(server: ServeProcess) -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 2,
        "temperature": 0,
        "system": "You are a coding agent.",
        "messages": [
            {"role": "user", "content": "Read a.txt."},
            {"role": "system", "content": "The user's plan: read files only."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": "sig"},
                    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.txt"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "hello"}]},
                    {"type": "text", "text": "<system-reminder>Be careful.</system-reminder>"},
                    {"type": "text", "text": "Done?", "cache_control": {"type": "ephemeral"}},
                ],
            },
        ],
        "tools": [{"name": "Read", "input_schema": FN_SCHEMA}],
        "metadata": {"user_id": "user_abc_account_def_session_123"},
    }
    r = post(server, "/v1/messages", body)
    assert r.status_code == 200, r.text
    count = post(server, "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    assert count.status_code == 200 and count.json()["input_tokens"] == (
        r.json()["usage"]["input_tokens"] + r.json()["usage"]["cache_read_input_tokens"]
    )


def test_refusals_name_the_field_in_the_official_shape(server: ServeProcess) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    r = post(server, "/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": [image]}]})
    assert r.status_code == 400
    err = r.json()
    assert set(err) == {"type", "error"} and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in err["error"]["message"] and "'image'" in err["error"]["message"]

    schema = {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}
    r = post(
        server,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": USER}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        },
    )
    assert r.status_code == 400 and "propertyNames" in r.json()["error"]["message"]

    for field, value in (("conversation", "conv_1"), ("prompt", {"id": "pmpt_1"})):
        r = post(server, "/v1/responses", {"input": USER, "store": False, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": USER}], "modalities": ["audio"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "modalities"
    r = post(
        server,
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}], "store": False},
    )
    assert r.status_code == 400 and "input[0].content[0]" in r.json()["error"]["message"]


def test_conversation_identity_from_what_clients_send() -> None:
    from runtime.serve.cluster.affinity import routing_key
    from runtime.serve.http.identity import conversation_of

    uid = "user_ab12_account_0f0e_session_8c1d2e3f-aaaa-bbbb-cccc-0123456789ab"
    claude = {b"x-claude-code-session-id": b"cc-1"}
    assert conversation_of(claude, b"{}") == "cc-1"
    assert conversation_of({b"x-session-id": b"s", **claude}, b"{}", "team") == "team/s"  # turnstile's first
    assert conversation_of({b"session_id": b"codex-1"}, b"{}") == "codex-1"
    assert conversation_of({}, b'{"prompt_cache_key": "conv-7", "input": "hi"}') == "conv-7"
    assert conversation_of({}, b'{"metadata": {"user_id": "%s"}}' % uid.encode()) == uid.rsplit("_", 1)[1]
    as_json = b'{"metadata": {"user_id": "{\\"device_id\\": \\"d\\", \\"session_id\\": \\"s-9\\"}"}}'
    assert conversation_of({}, as_json) == "s-9"
    assert conversation_of({}, b'{"messages": []}') is None and conversation_of({}, b"not json") is None
    body = b'{"prompt_cache_key": "conv-7", "messages": [{"role": "user", "content": "a"}]}'
    assert routing_key(conversation_of({}, body), body) == "session:conv-7"  # the Ray router's affinity key
