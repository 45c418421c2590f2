"""gpt-oss end to end against llama-server: a 5-turn conversation with a tool, on a tiny model with gpt-oss's real
template (from the vendored tree) and its harmony specials as single tokens, each reply forced by a raw grammar
(analysis channel, then a tool call or a final answer), and every turn's prompt equal to llama-server's
`/apply-template` render of the same history with the same tools.

The grammar writes the harmony markers as token literals (`<|channel|>`, `<|message|>`, `<|start|>`, `<|end|>`:
the tokens a real gpt-oss emits) and ends before `<|call|>` / `<|return|>` (end-of-generation tokens, which a grammar
cannot name: `runtime.grammar.tokens`); the model then ends the reply itself.

Tools: where turnstile knows gpt-oss's harmony tool syntax (the native format of issue 24) the turns offer `tools`
and a parsed call is used as it is; until then the template's own format is the generic one (tools described in a
system message, which is not what llama-server renders for gpt-oss), so the tools reach the template as the
variable its Jinja reads (`chat_template_kwargs={"tools": ...}`, the same text as llama-server's) and the call, left
in the text, is stored through the session API (export, the assistant message with the call, import), as an app
would store a call it parsed. Either way the call's reasoning reaches the template as gpt-oss reads it
(`thinking`): the next prompt renders it in the analysis channel, on both sides.

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary (as the other oracle tests).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime import Runtime
from runtime.grammar.gbnf import format_literal
from tests.reasoning.test_reasoning_oracle import _BINARY, pytestmark  # noqa: F401 - the oracle marks
from tests.support.llama_server import LlamaServer
from tests.support.reasoning_models import vendored_template, write_harmony

TEMPLATE = "openai-gpt-oss-120b.jinja"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL_ID = "call_1"
ARGS = {"city": "Paris"}


def analysis(text: str) -> str:
    return f'<|channel|> "analysis" <|message|> {format_literal(text)} <|end|> <|start|> "assistant" '


def final(thought: str, answer: str) -> str:
    return "root ::= " + analysis(thought) + f'<|channel|> "final" <|message|> {format_literal(answer)}'


CALL_GRAMMAR = (
    "root ::= "
    + analysis("need weather")
    + '<|channel|> "commentary to=functions.get_weather " <|constrain|> "json" <|message|> '
    + format_literal(json.dumps(ARGS, separators=(",", ":")))
)
# (user message or None for the tool result, the grammar, the reasoning and answer expected)
TURNS: list[tuple[str | None, str, str, str]] = [
    ("What is the weather in Paris?", CALL_GRAMMAR, "need weather", ""),
    (None, final("got it", "It is sunny in Paris."), "got it", "It is sunny in Paris."),
    ("And tomorrow?", final("guess", "Probably sunny too."), "guess", "Probably sunny too."),
    ("Thanks!", final("be kind", "You are welcome."), "be kind", "You are welcome."),
    ("Bye.", final("end", "Goodbye!"), "end", "Goodbye!"),
]


def _wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An exported session's messages as a request's (no `created`)."""
    return [{k: v for k, v in m.items() if k != "created"} for m in messages]


async def test_a_five_turn_tool_conversation_renders_every_prompt_as_llama_server(tmp_path: Path) -> None:
    model = write_harmony(tmp_path / "oss.gguf", vendored_template(TEMPLATE))
    path = tmp_path / TEMPLATE
    path.write_text(vendored_template(TEMPLATE), encoding="utf-8")
    ours: list[str] = []
    our_tokens: list[list[int]] = []
    histories: list[list[dict[str, Any]]] = []
    async with Runtime.open(model, n_ctx=4096, n_threads=1) as rt:
        backend: Any = rt.backend
        prepare = backend.prepare

        def recording(*args: Any, **kwargs: Any) -> Any:
            rendered = prepare(*args, **kwargs)
            ours.append(rendered.text)
            our_tokens.append(list(rendered.tokens))
            return rendered

        backend.prepare = recording
        native = backend.tool_format().name != "generic"
        offer: dict[str, Any] = {"tools": [TOOL]} if native else {"chat_template_kwargs": {"tools": [TOOL]}}
        expected: list[dict[str, Any]] = []
        call_id = CALL_ID
        for user, grammar, reasoning, answer in TURNS:
            kw: dict[str, Any] = {**offer, "grammar": grammar, "temperature": 0, "max_tokens": 200}
            if user is not None:
                expected.append({"role": "user", "content": user})
                reply = await rt.chat("oss", user, **kw)
            else:
                expected.append({"role": "tool", "content": "sunny", "tool_call_id": call_id})
                reply = await rt.chat("oss", tool_results={call_id: "sunny"}, **kw)
            histories.append(list(expected))
            assert reply.reasoning == reasoning
            if grammar is CALL_GRAMMAR:
                if reply.tool_calls:  # parsed (the harmony format)
                    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("get_weather", ARGS)]
                    call_id = reply.tool_calls[0].id
                else:  # left in the text: stored parsed through the session API
                    assert reply.text.endswith('<|message|>{"city":"Paris"}')
                    doc = json.loads(await rt.export("oss"))
                    wire = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
                    doc["messages"][-1] = {
                        "role": "assistant",
                        "content": "",
                        "reasoning_content": reasoning,
                        "tool_calls": [wire],
                    }
                    await rt.import_(json.dumps(doc), overwrite=True)
                arguments = json.dumps(ARGS, separators=(",", ":"))
                call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
                expected.append({"role": "assistant", "content": "", "tool_calls": [call]})
                expected[-1]["reasoning_content"] = reasoning
            else:
                assert (reply.text, reply.finish_reason) == (answer, "stop")
                expected.append({"role": "assistant", "content": answer, "reasoning_content": reasoning})
            stored = _wire(json.loads(await rt.export("oss"))["messages"])
            assert stored == expected
    assert len(ours) == len(TURNS)
    with LlamaServer(
        _BINARY, model, n_ctx=4096, threads=1, cache_ram_mib=0, extra_args=["--chat-template-file", str(path)]
    ) as srv:
        theirs = [
            str(srv._request("POST", "/apply-template", {"messages": h, "tools": [TOOL]})["prompt"]) for h in histories
        ]
        their_tokens = [srv.tokenize(t) for t in theirs]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        print(f"turn {i + 1}: {'same' if a == b else 'DIFFERENT'} ({len(a)} characters)")
        assert a == b, (i, a, b)
        assert our_tokens[i] == their_tokens[i], i  # and the tokens the slot was given are llama-server's
    # gpt-oss reads an assistant's reasoning as `thinking`: the call's reasoning is in the analysis channel of the
    # prompt that follows its result, and dropped once a final answer closed the exchange
    assert "<|channel|>analysis<|message|>need weather<|end|>" in ours[1]
    assert "need weather" not in ours[2] and "get_weather" in ours[2]
    assert ours[-1].endswith("<|start|>user<|message|>Bye.<|end|><|start|>assistant")
