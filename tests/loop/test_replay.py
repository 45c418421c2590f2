"""Byte-exact replay of generated replies (runtime.loop.replay) on real llama.cpp: a tiny scripted Qwen 2.5
model whose greedy reply is one tool call (a single token, its JSON written without spaces), then an answer
once the tool result is in the prompt. A client resends the call re-serialized (the template writes
`{"name": ..., "arguments": ...}` with spaces, in bytes): with replay the next prompt reuses every token
the slot holds; without it the common prefix ends at the reply's first token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.loop.replay import Replay

CALL = '{"name":"read_file","arguments":{"path":"notes.txt"}}'
ANSWER = "The notes say hello."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]
ASK = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Read notes.txt."}]


def resent(reply: Any, arguments: str) -> list[dict[str, Any]]:
    """The conversation as a client resends it: the call with its id and re-serialized arguments, its result."""
    call = reply.tool_calls[0]
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}],
    }
    return [*ASK, assistant, {"role": "tool", "tool_call_id": call.id, "content": "hello"}]


@pytest.mark.parametrize("replay", [True, False])
async def test_a_resent_tool_call_reuses_the_generated_tokens(caller: Path, replay: bool) -> None:
    async with Runtime.open(caller, n_ctx=2048, n_threads=1) as rt:
        rt.set_replay(replay)
        first = await rt.complete(ASK, tools=TOOLS, temperature=0)
        assert [(c.name, c.arguments) for c in first.tool_calls] == [("read_file", {"path": "notes.txt"})]
        held = first.usage.prompt_tokens + first.usage.generated_tokens  # the slot: the prompt and the reply
        pretty = json.dumps(first.tool_calls[0].arguments, indent=2)  # another spelling of the same arguments
        second = await rt.complete(resent(first, pretty), tools=TOOLS, temperature=0)
        assert second.text == ANSWER
        if replay:
            assert second.usage.cached_tokens == held  # everything the slot held: only new tokens prefilled
        else:
            # the common prefix ends after `<tool_call>`: the call's text is spelled otherwise, the rest recomputed
            assert second.usage.cached_tokens == first.usage.prompt_tokens + 1 < held


def test_splice_rules() -> None:
    r = Replay()
    same = lambda a, b: True  # noqa: E731
    r.remember([1, 2, 3], [7, 8, 9], at_eog=True)  # 9: the end-of-generation token
    assert r.splice([1, 2, 3, 4, 4, 4, 9, 5, 6], same).tokens == [1, 2, 3, 7, 8, 9, 5, 6]
    assert r.splice([1, 2, 3, 4, 4, 4, 9, 5, 6], lambda a, b: False).tokens == [1, 2, 3, 4, 4, 4, 9, 5, 6]
    assert r.splice([1, 2, 0, 4, 9], same).tokens == [1, 2, 0, 4, 9]  # not the kept prompt: untouched
    assert r.splice([1, 2, 3, 4, 4], same).tokens == [1, 2, 3, 4, 4]  # no end of the reply: untouched
    # a chain: the spliced prompt is the next kept turn's prefix
    r.remember([1, 2, 3, 7, 8, 9, 5, 6], [11, 9], at_eog=True)
    out = r.splice([1, 2, 3, 4, 9, 5, 6, 12, 9, 13], same)
    assert out.tokens == [1, 2, 3, 7, 8, 9, 5, 6, 11, 9, 13]
    assert out.shift([0, 5, 9]) == [0, 6, 10]  # message starts after a splice move with it
    r.remember([1], [2], at_eog=False)  # stopped otherwise (a stop string, the token limit): not kept
    assert r.splice([1, 3, 2], same).tokens == [1, 3, 2]
