"""Budget parity with llama-server: on a tiny model with Qwen3's real template and a raw grammar that leaves the
reasoning free (`[a-z]*` between the tags), llama-server run with `--reasoning-budget N` (and
`--reasoning-budget-message`) and turnstile opened with the same budget give the same content and
reasoning_content, streamed and not; a request's own budget fields override the server's on both sides.

The budget closes the block the way llama-server's reasoning-budget sampler does (common/reasoning-budget.cpp):
after N generated tokens inside the block, message + closer are forced token by token, then the grammar goes on.
Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (as the other oracle tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import Reasoning, Runtime
from tests.reasoning.test_reasoning_oracle import _BINARY, _server_stream, pytestmark  # noqa: F401 - the oracle marks
from tests.support.llama_server import LlamaServer
from tests.support.reasoning_models import vendored_template, write_thinking

TEMPLATE = "Qwen-Qwen3-0.6B.jinja"
# the tags as token literals: the model emits `<think>` and `</think>` as the single tokens a real model emits
GRAMMAR = r'root ::= <think> [a-z]* </think> "\n\nhi"'
MESSAGES = [{"role": "user", "content": "hi"}]

# (server flags: budget, message), then per request: (budget fields sent, or None for the server's)
SERVERS: list[tuple[int, str | None]] = [(2, "zz"), (0, None), (5, None), (-1, None)]
REQUESTS: list[dict[str, Any] | None] = [
    None,
    {"reasoning_budget": 1, "reasoning_budget_message": "done"},
    {"reasoning_budget": 0},
]


def _ours(rt_budget: int, message: str | None) -> dict[str, Any]:
    """Runtime.open's budget keywords as `turnstile serve --reasoning-budget` passes them."""
    return {"reasoning_budget": None if rt_budget == -1 else rt_budget, "reasoning_budget_message": message}


def _body(req: dict[str, Any] | None) -> dict[str, Any]:
    """The request's budget fields in llama-server's names."""
    if req is None:
        return {}
    out: dict[str, Any] = {"reasoning_budget_tokens": req["reasoning_budget"]}
    if "reasoning_budget_message" in req:
        out["reasoning_budget_message"] = req["reasoning_budget_message"]
    return out


@pytest.mark.parametrize(("budget", "message"), SERVERS)
async def test_budget_gives_llama_servers_content_and_reasoning(
    tmp_path: Path, budget: int, message: str | None
) -> None:
    model = write_thinking(tmp_path / "m.gguf", vendored_template(TEMPLATE))
    flags = ["--reasoning-budget", str(budget)] + (["--reasoning-budget-message", message] if message else [])
    theirs: list[tuple[str, str]] = []
    with LlamaServer(_BINARY, model, n_ctx=2048, threads=1, cache_ram_mib=0, extra_args=flags) as srv:
        for req in REQUESTS:
            m = srv.chat(MESSAGES, max_tokens=60, grammar=GRAMMAR, **_body(req)).raw["choices"][0]["message"]
            theirs.append(((m.get("content") or ""), (m.get("reasoning_content") or "")))
            body = {"messages": MESSAGES, "grammar": GRAMMAR, "max_tokens": 60, "temperature": 0, **_body(req)}
            assert _server_stream(srv, body) == theirs[-1]
    async with Runtime.open(model, n_ctx=2048, n_threads=1, **_ours(budget, message)) as rt:
        for req, their in zip(REQUESTS, theirs, strict=True):
            kw: dict[str, Any] = {"grammar": GRAMMAR, "temperature": 0, "max_tokens": 60, **(req or {})}
            reply = await rt.complete(MESSAGES, **kw)
            items = [p async for p in rt.complete_stream(MESSAGES, **kw)]
            streamed = (
                "".join(p for p in items[:-1] if isinstance(p, str) and not isinstance(p, Reasoning)),
                "".join(p for p in items[:-1] if isinstance(p, Reasoning)),
            )
            ours = (reply.text, reply.reasoning)
            print(f"budget {budget} message {message!r} request {req}: ours={ours!r} llama-server={their!r}")
            assert ours == their
            assert streamed == ours
    if budget == 2 and message == "zz":
        assert theirs[0][1].endswith("zz") and len(theirs[0][1]) > 2  # two free tokens, then the message
    if budget == 0:
        assert theirs[0] == ("hi", "")


SPELLED = r'root ::= "<think>" [a-z]* "</think>" "\n\nhi"'


async def test_tags_spelled_in_text_tokens_arm_only_turnstiles_budget(tmp_path: Path) -> None:
    """The one known difference: llama-server's budget matches the tags' token sequences, turnstile's matches their
    text (`runtime.reasoning.budget`), so when a grammar lets the model spell `<think>` in text tokens llama-server
    counts nothing (its parser still calls the text reasoning), turnstile applies the budget. Real models emit the
    tags as their single tokens, where both agree (the test above)."""
    model = write_thinking(tmp_path / "m.gguf", vendored_template(TEMPLATE))
    flags = ["--reasoning-budget", "2", "--reasoning-budget-message", "zz"]
    with LlamaServer(_BINARY, model, n_ctx=2048, threads=1, cache_ram_mib=0, extra_args=flags) as srv:
        m = srv.chat(MESSAGES, max_tokens=60, grammar=SPELLED).raw["choices"][0]["message"]
    async with Runtime.open(model, n_ctx=2048, n_threads=1, reasoning_budget=2, reasoning_budget_message="zz") as rt:
        reply = await rt.complete(MESSAGES, grammar=SPELLED, temperature=0, max_tokens=60)
    assert (m["content"], m["reasoning_content"]) == ("hi", "yozsix")  # greedy, no budget
    assert (reply.text, reply.reasoning) == ("hi", "yozz")  # two free tokens, then the message
