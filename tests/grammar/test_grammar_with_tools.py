"""A raw `grammar` given together with `tools` decides the reply's text, which is then parsed for tool calls as
usual (llama-server refuses the combination): on a tiny model with Qwen 2.5's template (Hermes `<tool_call>`),
a grammar that forces a call yields a Reply with that call, stored; its result answered as any call's."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Runtime
from runtime.errors import InvalidGrammar, InvalidRequest
from runtime.grammar.gbnf import format_literal

pytestmark = pytest.mark.anyio

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_a_grammar_forcing_a_call_gives_a_reply_with_the_call(qwen: Path) -> None:
    async with Runtime.open(qwen, n_ctx=2048, n_threads=1) as rt:
        reply = await rt.chat("a", "add 1 and 2", tools=[add], grammar="root ::= " + format_literal(CALL))
        assert reply.finish_reason == "tool_calls" and reply.text == ""
        assert [(c.name, c.arguments) for c in reply.tool_calls] == [("add", {"a": 1, "b": 2})]
        stored = (await rt.get_session("a")).messages[-1]
        assert stored.tool_calls == reply.tool_calls
        answer = await rt.chat("a", tool_results={reply.tool_calls[0].id: 3}, tools=[add], grammar='root ::= "3."')
        assert (answer.text, answer.finish_reason, answer.tool_calls) == ("3.", "stop", ())
        # text before the call is the content, as a model's would be
        pre = await rt.chat("b", "add", tools=[add], grammar="root ::= " + format_literal("Sure.\n" + CALL))
        assert pre.text == "Sure." and len(pre.tool_calls) == 1
        # tool_choice "none": the grammar's text is the content, no call is parsed
        none = await rt.chat("c", "add", tools=[add], tool_choice="none", grammar='root ::= "no tools"')
        assert (none.text, none.tool_calls) == ("no tools", ())


async def test_grammar_with_tools_is_checked_before_anything_is_queued(qwen: Path) -> None:
    async with Runtime.open(qwen, n_ctx=2048, n_threads=1) as rt:
        with pytest.raises(InvalidGrammar):
            await rt.chat("a", "x", tools=[add], grammar="root ::= nothing")
        with pytest.raises(InvalidRequest, match="use response_format alone, not with grammar"):
            await rt.chat("a", "x", response_format="json", grammar='root ::= "{}"')
        with pytest.raises(InvalidRequest, match="use response_format alone, not with grammar and tools"):
            await rt.chat("a", "x", response_format="json", grammar='root ::= "{}"', tools=[add])
        assert rt.stats().scheduler.submitted == 0
        assert await rt.list_sessions() == []
