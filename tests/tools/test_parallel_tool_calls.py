"""`parallel_tool_calls` (chat completions, Responses) and Messages' `disable_parallel_tool_use`: false means
at most one call per reply, in the grammar (one call, then the end of the reply) and in the parse (the first
call kept); true lets a reply make several. (llama-server's own false is looser on Hermes-style formats: see
`test_explicit_flags_match_llama_server`.)

The HTTP tests run a real `turnstile serve` on `write_tool_caller`'s model with a second call: its greedy
reply is two calls, unless the grammar ends the reply after the first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from anthropic import Anthropic
from openai import OpenAI

from runtime import Runtime
from runtime.errors import InvalidRequest
from runtime.grammar.gbnf import format_literal
from runtime.loop.constraints import Constraints
from runtime.tools import HermesFormat, ToolFormat, ToolPlan
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.process import ServeProcess
from tests.support.scripted_models import write_tool_caller

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
SECOND = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
PARAMS: Any = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL: Any = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
RESP_TOOL: Any = {"type": "function", "name": "get_weather", "parameters": PARAMS, "strict": True}
ANT_TOOL: Any = {"name": "get_weather", "input_schema": PARAMS}
TWO_CALLS = f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{SECOND}\n</tool_call>"


def hermes() -> ToolFormat:
    return HermesFormat()


@pytest.mark.parametrize(
    ("parallel", "cities"), [(False, ["Paris"]), (None, ["Paris", "Rome"]), (True, ["Paris", "Rome"])]
)
def test_parse_keeps_only_the_first_call_when_parallel_is_false(parallel: bool | None, cities: list[str]) -> None:
    plan = ToolPlan.build(hermes(), [CHAT_TOOL], "auto", parallel=parallel)
    reply = plan.parse(TWO_CALLS, seed="s")
    assert [c.arguments for c in reply.tool_calls] == [{"city": c} for c in cities]
    assert [c.arguments for c in plan.partial(TWO_CALLS, seed="s").calls] == [json.dumps({"city": c}) for c in cities]


def test_grammar_admits_several_calls_only_when_parallel() -> None:
    one = ToolPlan.build(hermes(), [CHAT_TOOL], "required", parallel=False).grammar
    default = ToolPlan.build(hermes(), [CHAT_TOOL], "required").grammar
    several = ToolPlan.build(hermes(), [CHAT_TOOL], "required", parallel=True).grammar
    assert one is not None and default is not None and several is not None
    assert one.gbnf == default.gbnf != several.gbnf
    assert "tool-call+" in several.gbnf.replace(" ", "") and "tool-call+" not in one.gbnf.replace(" ", "")


def test_parallel_tool_calls_must_be_a_bool() -> None:
    with pytest.raises(InvalidRequest, match="parallel_tool_calls"):
        Constraints.build(
            tools=[CHAT_TOOL],
            parallel_tool_calls="no",  # type: ignore[arg-type]
            tool_format=hermes,
            generation_prompt=lambda: "",
        )


@pytest.mark.anyio
async def test_a_raw_grammar_with_two_calls_gives_one_when_parallel_is_false(tmp_path: Path) -> None:
    path = write_tool_caller(tmp_path / "c.gguf", call=CALL, answer="Sunny.")
    grammar = "root ::= " + format_literal(TWO_CALLS)
    async with Runtime.open(path, n_ctx=2048, n_threads=1) as rt:
        one = await rt.chat("a", "x", tools=[CHAT_TOOL], grammar=grammar, parallel_tool_calls=False)
        assert [c.arguments for c in one.tool_calls] == [{"city": "Paris"}]
        assert [c.arguments for c in (await rt.get_session("a")).messages[-1].tool_calls] == [{"city": "Paris"}]
        both = await rt.chat("b", "x", tools=[CHAT_TOOL], grammar=grammar, parallel_tool_calls=True)
        assert [c.arguments for c in both.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tool_caller(
        tmp_path_factory.mktemp("two") / "two.gguf", call=CALL, answer="Sunny.", second_call=SECOND
    )
    with ServeProcess("--model", path, "--threads", "1", "--ctx", "2048") as srv:
        yield srv


def cities(calls: list[Any]) -> list[str]:
    return [json.loads(a)["city"] if isinstance(a, str) else a["city"] for a in calls]


@pytest.mark.slow
@pytest.mark.parametrize(("flag", "want"), [(False, ["Paris"]), (True, ["Paris", "Rome"]), (None, ["Paris"])])
def test_http_dialects_make_one_call_unless_parallel(server: Any, flag: bool | None, want: list[str]) -> None:
    oai = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    extra: dict[str, Any] = {} if flag is None else {"parallel_tool_calls": flag}
    user: Any = [{"role": "user", "content": "Weather in Paris and Rome?"}]
    chat = oai.chat.completions.create(
        model="m", messages=user, tools=[CHAT_TOOL], tool_choice="required", temperature=0, max_tokens=16, **extra
    )
    calls = chat.choices[0].message.tool_calls or []
    assert cities([c.function.arguments for c in calls]) == want
    assert chat.choices[0].finish_reason == "tool_calls"
    resp = oai.responses.create(
        model="m",
        input=user,
        tools=[RESP_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=16,
        store=False,
        **extra,
    )
    assert cities([o.arguments for o in resp.output if o.type == "function_call"]) == want
    assert resp.parallel_tool_calls is (True if flag is None else flag)
    ant = Anthropic(base_url=server.url, api_key="none", max_retries=0)
    choice: Any = {"type": "any"} | ({} if flag is None else {"disable_parallel_tool_use": not flag})
    msg = ant.messages.create(
        model="m",
        max_tokens=16,
        messages=user,
        tools=[ANT_TOOL],
        tool_choice=choice,
        extra_body={"temperature": 0},
    )
    assert cities([b.input for b in msg.content if b.type == "tool_use"]) == want
    assert msg.stop_reason == "tool_use"


@pytest.mark.oracle
@pytest.mark.slow
def test_explicit_flags_match_llama_server(server: Any, tmp_path: Path) -> None:
    """`parallel_tool_calls: true`: llama-server's /v1/chat/completions makes the same two calls. `false`: turnstile
    makes one; llama-server still makes two on this (Hermes-style, one `<tool_call>` per call) format: its
    autoparser wraps the one-call parser in `one_or_more` for formats with a per-call opener and no section
    (common/chat-auto-parser-generator.cpp, build_tool_parser_json_native), so the flag only limits calls inside
    one section. turnstile keeps to the API's meaning (at most one call); the test notices if llama.cpp changes.
    (Without the flag llama-server is parallel where the template can render several calls; turnstile makes one.)"""
    path = write_tool_caller(tmp_path / "two.gguf", call=CALL, answer="Sunny.", second_call=SECOND)
    user: Any = [{"role": "user", "content": "Weather in Paris and Rome?"}]

    def calls(url: str, flag: bool) -> list[str]:
        oai = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = oai.chat.completions.create(
            model="m",
            messages=user,
            tools=[CHAT_TOOL],
            tool_choice="required",
            temperature=0,
            max_tokens=16,
            parallel_tool_calls=flag,
        )
        return cities([c.function.arguments for c in r.choices[0].message.tool_calls or []])  # type: ignore[union-attr]

    with LlamaServer(llama_server_binary(), path, n_ctx=2048, threads=1, cache_ram_mib=64) as srv:
        want = {flag: calls(srv.url, flag) for flag in (False, True)}
    assert want == {False: ["Paris", "Rome"], True: ["Paris", "Rome"]}
    assert {flag: calls(server.url, flag) for flag in (False, True)} == {False: ["Paris"], True: want[True]}
