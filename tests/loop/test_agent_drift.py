"""Cache reuse under coding agents' drift, through the HTTP app in-process on real llama.cpp (the scripted
Qwen 2.5 tool caller: a call, then an answer once the tool result is in the prompt), one test per cause:

- Claude Code (Messages): a per-request `cch=` stamp in the billing line of the system prompt, and the
  tool call resent as `input` (re-serialized JSON): with the normalization and the replay, the second turn
  reads everything the first left in the slot from the cache; with `normalize=False` the prompt is the one
  sent, and the cache ends at the stamp;
- Codex (Responses, `store: false`, the whole input resent every turn): the same, through function_call
  items whose `arguments` string is the one turnstile returned;
- a template that drops earlier reasoning after a new user message (Qwen3), and a `<system-reminder>` block
  that moves: the cache is kept up to the first changed token and the rest recomputed (the lookup rule).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import msgspec
import pytest

from runtime import Runtime
from runtime.serve.http.app import build
from runtime.serve.http.messages.convert import MessagesRequest, prompt_of
from runtime.serve.http.state import ServeState

CALL = '{"name":"read_file","arguments":{"path":"notes.txt"}}'
ANSWER = "The notes say hello."
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli; cch={};"


@asynccontextmanager
async def served(model: Path, *, normalize: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    async with Runtime.open(model, n_ctx=2048, n_threads=1) as rt:
        application = build(ServeState(runtime=rt, normalize=normalize))
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as c:
            yield c


def claude_code(stamp: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "temperature": 0,
        "system": [
            {"type": "text", "text": BILLING.format(stamp)},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [{"name": "read_file", "description": "Read a file.", "input_schema": SCHEMA}],
        "messages": history,
    }


@pytest.mark.parametrize("normalize", [True, False])
async def test_claude_code_billing_line_and_resent_tool_use(caller: Path, normalize: bool) -> None:
    ask = [{"role": "user", "content": [{"type": "text", "text": "Read notes.txt."}]}]
    async with served(caller, normalize=normalize) as c:
        first = (await c.post("/v1/messages", json=claude_code("1a2b3", ask))).json()
        use = first["content"][-1]
        assert first["stop_reason"] == "tool_use" and use["input"] == {"path": "notes.txt"}
        u1 = first["usage"]
        held = u1["input_tokens"] + u1["cache_read_input_tokens"] + u1["output_tokens"]
        history = [
            *ask,
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "hello"}]},
        ]
        second = (await c.post("/v1/messages", json=claude_code("9f8e7", history))).json()
        assert second["content"] == [{"type": "text", "text": ANSWER}]
        read = second["usage"]["cache_read_input_tokens"]
        if normalize:
            assert read == held  # the whole first turn: only the tool result and what follows are prefilled
        else:
            stamp_at = len("<|im_start|>system\n" + BILLING.split("{}")[0])  # at most a token a character
            assert read < stamp_at < held  # the cache ends at the stamp


def test_the_switch_off_gives_the_prompt_as_sent() -> None:
    body = {
        "system": [{"type": "text", "text": BILLING.format("1a2b3")}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    req = msgspec.convert(body, MessagesRequest)
    on, _ = prompt_of(req)
    off, _ = prompt_of(req, normalize=False)
    assert on[0]["content"] == BILLING.format("fffff")
    assert off[0]["content"] == BILLING.format("1a2b3")
    assert on[1:] == off[1:]


async def test_codex_whole_input_resent_with_store_false(caller: Path) -> None:
    tools = [{"type": "function", "name": "read_file", "description": "Read a file.", "parameters": SCHEMA}]
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read notes.txt."}]},
    ]
    base = {"model": "gpt-5-codex", "tools": tools, "store": False, "temperature": 0, "stream": False}
    base |= {"client_metadata": {"x": "y"}, "prompt_cache_key": "conv-1", "include": ["reasoning.encrypted_content"]}
    async with served(caller) as c:
        first = (await c.post("/v1/responses", json={**base, "input": items})).json()
        call = first["output"][-1]
        assert call["type"] == "function_call" and call["name"] == "read_file"
        held = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
        items += [
            {k: call[k] for k in ("type", "call_id", "name", "arguments")},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "hello"},
        ]
        second = (await c.post("/v1/responses", json={**base, "input": items})).json()
        assert second["output"][-1]["content"][0]["text"] == ANSWER
        assert second["usage"]["input_tokens_details"]["cached_tokens"] == held


async def test_a_template_that_drops_earlier_reasoning_recomputes_from_the_first_change(tmp_path: Path) -> None:
    """Qwen3's template keeps an assistant's reasoning while the tool loop runs and drops it once a new user
    message follows: the next prompt differs from the cached one where that reasoning was, and only the
    tokens from there on are recomputed (the lookup rule; replay does not override the template)."""
    from tests.support.reasoning_models import write_thinking
    from tests.support.thinking_models import qwen3_template

    model = write_thinking(tmp_path / "qwen3.gguf", qwen3_template())
    tool = [{"type": "function", "function": {"name": "read_file", "parameters": SCHEMA}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
    loop: list[dict[str, Any]] = [
        {"role": "user", "content": "Read a."},
        {"role": "assistant", "content": "", "reasoning_content": "I should read a.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
    ]
    after: list[dict[str, Any]] = [
        *loop,
        {"role": "assistant", "content": "It says hello."},
        {"role": "user", "content": "Thanks."},
    ]
    async with Runtime.open(model, n_ctx=1024, n_threads=1) as rt:
        first = await rt.complete(loop, tools=tool, max_tokens=2, temperature=0)
        second = await rt.complete(after, tools=tool, max_tokens=2, temperature=0)
        be = rt.backend
        a = be.tokenize(be.apply_template(loop, tools=tool))
        b = be.tokenize(be.apply_template(after, tools=tool))
    assert "I should read a." in be.apply_template(loop, tools=tool)
    assert "I should read a." not in be.apply_template(after, tools=tool)  # dropped after the new user message
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert first.usage.prompt_tokens == len(a) and second.usage.prompt_tokens == len(b)
    assert second.usage.cached_tokens == common < len(a)  # kept up to the first change, recomputed after it


async def test_a_moving_system_reminder_recomputes_from_where_it_was(tmp_path: Path) -> None:
    """A client that moves a `<system-reminder>` block (not normalized: it is content) keeps the cache up to
    the block's old place; the turn recomputes from there on, never less."""
    from tests.support.reasoning_models import write_thinking
    from tests.support.thinking_models import qwen3_template

    model = write_thinking(tmp_path / "qwen3.gguf", qwen3_template())
    reminder = "<system-reminder>Files changed: a.txt</system-reminder>\n"
    sys_ = {"role": "system", "content": "You are a coding agent."}
    turn1 = [sys_, {"role": "user", "content": "Read a.txt and tell me."}, {"role": "assistant", "content": "Ok."}]
    before = [*turn1[:1], {"role": "user", "content": reminder + "Read a.txt and tell me."}]
    moved = [*turn1, {"role": "user", "content": reminder + "Now b.txt."}]  # the block moved to the last message
    async with Runtime.open(model, n_ctx=1024, n_threads=1) as rt:
        await rt.complete(before, max_tokens=2, temperature=0)
        second = await rt.complete(moved, max_tokens=2, temperature=0)
        be = rt.backend
        a, b = be.tokenize(be.apply_template(before)), be.tokenize(be.apply_template(moved))
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert second.usage.cached_tokens == common  # the system prompt and the user header: kept
