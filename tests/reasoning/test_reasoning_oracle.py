"""Reasoning parity with llama-server: on a tiny model with each family's real template (from the vendored tree),
the same literal grammar forces the same output on both sides, and llama-server's /v1/chat/completions and
turnstile give the same content and reasoning_content, streamed and not, with reasoning_format "auto" and "none".

Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary built from the vendored llama.cpp (as the
other oracle tests). Prints one line per template and format.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from runtime import Reasoning, Runtime
from runtime.grammar.gbnf import format_literal
from runtime.reasoning import detect
from tests.reasoning.test_reasoning_models import FAMILIES
from tests.support.llama_server import LlamaServer
from tests.support.reasoning_models import vendored_template, write_thinking

ENV = "TURNSTILE_LLAMA_SERVER"
_BINARY = os.environ.get(ENV, "")


def _skip_reason() -> str | None:
    if not _BINARY:
        return f"{ENV} is not set (it names a llama-server binary to compare with)"
    if not (os.path.isfile(_BINARY) and os.access(_BINARY, os.X_OK)):
        return f"{ENV}={_BINARY!r} is not an executable file"
    return None


pytestmark = [
    pytest.mark.oracle,
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]

# (template, forced output) for the families, in each one's syntax, plus the templates that open the block
HEADERS = {"harmony": "<|start|>assistant<|channel|>final<|message|>", "command-r7b": "<|START_RESPONSE|>"}
CASES = [
    (
        t,
        ("" if inside else detect(vendored_template(t)).start)  # type: ignore[union-attr]
        + " hmm\nok "
        + detect(vendored_template(t)).end  # type: ignore[union-attr]
        + HEADERS.get(f, "\n\n")
        + "hello",
    )
    for t, f, inside, _ in FAMILIES
] + [
    ("Qwen-QwQ-32B.jinja", "hmm\n</think>\n\nhello"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "hmm\n</think>\n\nhello"),
    ("Qwen-Qwen3-0.6B.jinja", "<think>\nhmm ok\n</think>\n\nhello world"),
]
KNOWN = {  # templates where llama-server's answer differs (not a llama-server bug: its autoparser's analysis of the
    # template, `common/chat-diff-analyzer.cpp`, which turnstile approximates by one render, finds other spaces)
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "llama-server skips all whitespace after `<think>\n` and after "
    "`</think>` (the template writes `\n` after each); turnstile takes what the template writes",
    "Qwen3.5-4B.jinja": "llama-server skips all whitespace after the opened `<think>\n` (the template trims the "
    "reasoning it renders); turnstile takes the template's `\n` only",
}


def _server_stream(srv: LlamaServer, body: dict[str, Any]) -> tuple[str, str]:
    req = urllib.request.Request(
        srv.url + "/v1/chat/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    content, reasoning = "", ""
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    delta = choice.get("delta", {})
                    content += delta.get("content") or ""
                    reasoning += delta.get("reasoning_content") or ""
    return content, reasoning


@pytest.mark.parametrize(("template", "output"), CASES)
async def test_content_and_reasoning_equal_llama_servers(tmp_path: Path, template: str, output: str) -> None:
    model = write_thinking(tmp_path / "m.gguf", vendored_template(template))
    grammar = "root ::= " + format_literal(output)
    path = tmp_path / template
    path.write_text(vendored_template(template), encoding="utf-8")
    messages = [{"role": "user", "content": "hi"}]
    with LlamaServer(
        _BINARY, model, n_ctx=4096, threads=1, cache_ram_mib=0, extra_args=["--chat-template-file", str(path)]
    ) as srv:
        theirs = {}
        for fmt in ("auto", "none"):
            body = {"messages": messages, "grammar": grammar, "reasoning_format": fmt, "max_tokens": 400}
            m = srv.chat(messages, max_tokens=400, grammar=grammar, reasoning_format=fmt).raw["choices"][0]["message"]
            theirs[fmt] = ((m.get("content") or ""), (m.get("reasoning_content") or ""))
            assert _server_stream(srv, body) == theirs[fmt]
    async with Runtime.open(model, n_ctx=4096, n_threads=1, reasoning="on") as rt:
        for fmt in ("auto", "none"):
            reply = await rt.complete(messages, grammar=grammar, temperature=0, reasoning_format=fmt, max_tokens=400)
            ours = (reply.text, reply.reasoning)
            items = [
                p
                async for p in rt.complete_stream(
                    messages, grammar=grammar, temperature=0, reasoning_format=fmt, max_tokens=400
                )
            ]
            streamed = (
                "".join(p for p in items[:-1] if isinstance(p, str) and not isinstance(p, Reasoning)),
                "".join(p for p in items[:-1] if isinstance(p, Reasoning)),
            )
            same = ours == theirs[fmt]
            print(f"{template} {fmt}: {'same' if same else 'DIFFERENT'} ours={ours!r} llama-server={theirs[fmt]!r}")
            assert streamed == ours
            if template in KNOWN and fmt == "auto":
                assert not same, f"{template} now matches: drop it from KNOWN"
                continue
            assert same


# Generation prompts that write reasoning markup, and answer wrappers: (template, thinking (None: the template's
# default), forced output, the (content, reasoning_content) llama-server gives for reasoning_format "none" and for
# "auto" (= "deepseek")), measured with the llama-server built from the vendored tree. Thinking off on Qwen3,
# SmolLM3, GLM, Qwen3.5, Nemotron 3, DeepSeek V3.1 writes an empty block in the generation prompt: llama-server parses
# the output as following it ("none" keeps it in the content; SmolLM3's `</think>\n` leaves its newline). Command
# R7B's "none" drops both answer markers; Granite's keeps its `<response>` tags, which wrap the answer only after a
# block; Apriel 1.6's generation prompt opens the reasoning with a preamble ("none" keeps the assistant header).
R7B = "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"
GRANITE = "ibm-granite-granite-3.3-2B-Instruct.jinja"
APRIEL = "Apriel-1.6-15b-Thinker-fixed.jinja"
PROMPT_CASES: list[tuple[str, bool | None, str, dict[str, tuple[str, str]]]] = [
    (
        "Qwen-Qwen3-0.6B.jinja",
        False,
        "hello",
        {"none": ("<think>\n\n</think>\n\nhello", ""), "auto": ("hello", "")},
    ),
    (
        "HuggingFaceTB-SmolLM3-3B.jinja",
        False,
        "hello",
        {"none": ("<think>\n\n</think>\nhello", ""), "auto": ("\nhello", "")},
    ),
    ("GLM-4.6.jinja", False, "hello", {"none": ("<think></think>hello", ""), "auto": ("hello", "")}),
    ("Qwen3.5-4B.jinja", False, "hello", {"none": ("<think>\n\n</think>\n\nhello", ""), "auto": ("hello", "")}),
    (
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
        False,
        "hello",
        {"none": ("<think></think>hello", ""), "auto": ("hello", "")},
    ),
    (
        "deepseek-ai-DeepSeek-V3.1.jinja",
        False,
        "hello",
        {"none": ("<think></think>hello", ""), "auto": ("hello", "")},
    ),
    (
        R7B,
        None,
        "<|START_THINKING|>hmm ok<|END_THINKING|><|START_RESPONSE|>hello<|END_RESPONSE|>",
        {"none": ("<|START_THINKING|>hmm ok<|END_THINKING|>hello", ""), "auto": ("hello", "hmm ok")},
    ),
    (
        GRANITE,
        True,
        "<think>hmm ok</think><response>hello</response>",
        {"none": ("<think>hmm ok</think><response>hello</response>", ""), "auto": ("hello", "hmm ok")},
    ),
    (
        GRANITE,
        None,
        "<response>hello</response>",
        {"none": ("<response>hello</response>", ""), "auto": ("<response>hello</response>", "")},
    ),
    (
        APRIEL,
        None,
        "hmm ok\n[BEGIN FINAL RESPONSE]\nhello",
        {
            "none": ("<|begin_assistant|>\nHere are my reasoning steps:\nhmm ok\n[BEGIN FINAL RESPONSE]\nhello", ""),
            "auto": ("hello", "Here are my reasoning steps:\nhmm ok\n"),
        },
    ),
]
# Where llama-server is wrong, and what it gives instead (turnstile gives the table's value). Granite 3.3 after a
# block: llama-server's template analysis knows the answer is wrapped in `<response>` … `</response>`
# (common/chat-diff-analyzer.cpp sets content_mode::WRAPPED_WITH_REASONING for this template) but its parser
# generator does not implement that mode yet ("TODO: WRAPPED_WITH_REASONING" there; the expected parse without
# the tags is commented out as "pending support" in tests/test-chat.cpp), so the tags stay in the content.
LLAMA_SERVER_BUGS: dict[tuple[str, bool | None, str], tuple[str, str]] = {
    (GRANITE, True, "auto"): ("<response>hello</response>", "hmm ok")
}


@pytest.mark.parametrize(("template", "thinking", "output", "expected"), PROMPT_CASES)
async def test_generation_prompt_markup_and_answer_wrappers_as_llama_server(
    tmp_path: Path, template: str, thinking: bool | None, output: str, expected: dict[str, tuple[str, str]]
) -> None:
    model = write_thinking(tmp_path / "m.gguf", vendored_template(template))
    grammar = "root ::= " + format_literal(output)
    path = tmp_path / template
    path.write_text(vendored_template(template), encoding="utf-8")
    messages = [{"role": "user", "content": "hi"}]
    kwargs: dict[str, Any] = {} if thinking is None else {"chat_template_kwargs": {"enable_thinking": thinking}}
    with LlamaServer(
        _BINARY, model, n_ctx=4096, threads=1, cache_ram_mib=0, extra_args=["--chat-template-file", str(path)]
    ) as srv:
        for fmt in ("none", "auto", "deepseek"):
            want = LLAMA_SERVER_BUGS.get((template, thinking, "auto" if fmt == "deepseek" else fmt))
            want = want or expected["auto" if fmt == "deepseek" else fmt]
            body = {"messages": messages, "grammar": grammar, "reasoning_format": fmt, "max_tokens": 400, **kwargs}
            m = srv.chat(messages, max_tokens=400, grammar=grammar, reasoning_format=fmt, **kwargs).raw["choices"][0]
            assert ((m["message"].get("content") or ""), (m["message"].get("reasoning_content") or "")) == want, fmt
            assert _server_stream(srv, body) == want, fmt
    mode = "auto" if thinking is None else ("on" if thinking else "off")
    async with Runtime.open(model, n_ctx=4096, n_threads=1, reasoning=mode) as rt:
        for fmt in ("none", "auto"):
            reply = await rt.complete(messages, grammar=grammar, temperature=0, reasoning_format=fmt, max_tokens=400)
            items = [
                p
                async for p in rt.complete_stream(
                    messages, grammar=grammar, temperature=0, reasoning_format=fmt, max_tokens=400
                )
            ]
            streamed = (
                "".join(p for p in items[:-1] if isinstance(p, str) and not isinstance(p, Reasoning)),
                "".join(p for p in items[:-1] if isinstance(p, Reasoning)),
            )
            assert (reply.text, reply.reasoning) == expected[fmt], fmt
            assert streamed == expected[fmt], fmt
