"""End to end on tiny models with real thinking templates (Qwen3, QwQ) from the vendored llama.cpp tree: outputs
forced by a raw GBNF grammar are split into reasoning and answer, streamed as `Reasoning` / `str` pieces, stored,
rendered back; `reasoning="off"` switches Qwen3's thinking off and closes QwQ's opened block at once; the budget
forces its message and the closer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import Runtime
from runtime.reasoning import Reasoning
from tests.support.reasoning_models import vendored_template, write_thinking

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    d = tmp_path_factory.mktemp("thinking-models")
    yield {
        "qwen3": write_thinking(d / "qwen3.gguf", vendored_template("Qwen-Qwen3-0.6B.jinja")),
        "qwq": write_thinking(d / "qwq.gguf", vendored_template("Qwen-QwQ-32B.jinja")),
        "r1": write_thinking(d / "r1.gguf", vendored_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")),
    }


def opened(path: Path) -> Runtime:
    return Runtime.open(path, n_ctx=1024, n_threads=1)  # type: ignore[return-value]


THOUGHT = r'root ::= "<think>\nhmm ok\n</think>\n\nhello world"'


async def test_qwen3_reasoning_is_split_streamed_stored_and_rendered_back(models: dict[str, Path]) -> None:
    async with Runtime.open(models["qwen3"], n_ctx=1024, n_threads=1) as rt:
        reply = await rt.chat("a", "hi", grammar=THOUGHT, temperature=0)
        # as llama-server: `<think>` takes its newline, the reasoning keeps the one before `</think>`
        assert (reply.reasoning, reply.text) == ("hmm ok\n", "hello world")
        items = [p async for p in rt.stream("a", "more", grammar=THOUGHT, temperature=0)]
        pieces = items[:-1]
        assert "".join(p for p in pieces if isinstance(p, Reasoning)) == "hmm ok\n"
        assert "".join(p for p in pieces if not isinstance(p, Reasoning)) == "hello world"
        assert not any("think>" in p for p in pieces)
        s = await rt.get_session("a")
        assert [(m.content, m.reasoning) for m in s.messages if m.role == "assistant"] == [
            ("hello world", "hmm ok\n")
        ] * 2
        prompt = rt.backend.engine.template.render_text(s.chat_messages())  # type: ignore[attr-defined]
        # Qwen3's template drops the reasoning of turns before the last user message, keeps the last one's
        assert prompt.count("hmm ok") == 1 and "<think>\nhmm ok\n</think>\n\nhello world<|im_end|>" in prompt


async def test_qwen3_reasoning_off_sets_enable_thinking_false(models: dict[str, Path]) -> None:
    async with Runtime.open(models["qwen3"], n_ctx=1024, n_threads=1, reasoning="off") as rt:
        reply = await rt.chat("a", "hi", grammar='root ::= "hello"', temperature=0)
        assert (reply.reasoning, reply.text) == ("", "hello")
        prompt = rt.backend.engine.template.render_text(  # type: ignore[attr-defined]
            [{"role": "user", "content": "hi"}], template_kwargs={"enable_thinking": False}
        )
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # what "off" rendered


OPENED = r'root ::= "hmm\n</think>\n\nhello"'


@pytest.mark.parametrize("name", ["qwq", "r1"])
async def test_output_starts_inside_a_block_the_generation_prompt_opened(models: dict[str, Path], name: str) -> None:
    async with Runtime.open(models[name], n_ctx=1024, n_threads=1, reasoning="on") as rt:  # QwQ: enable_thinking
        reply = await rt.chat("a", "hi", grammar=OPENED, temperature=0)
        # as llama-server: these templates render no reasoning, so the tags take no whitespace; the block holds
        # the generation prompt's newline after `<think>`
        assert (reply.reasoning, reply.text) == ("\nhmm\n", "\n\nhello")
        kept = await rt.chat("b", "hi", grammar=OPENED, temperature=0, reasoning_format="none")
        assert (kept.reasoning, kept.text) == ("", "<think>\nhmm\n</think>\n\nhello")  # as llama-server's "none"


async def test_off_on_a_template_that_always_opens_the_block_closes_it_at_once(models: dict[str, Path]) -> None:
    async with Runtime.open(models["r1"], n_ctx=1024, n_threads=1) as rt:  # R1 distill: no switch, always opened
        off = await rt.chat("b", "hi", grammar=r'root ::= "</think>" "\n"? "hello"', temperature=0, reasoning="off")
        assert (off.reasoning, off.text) == ("", "hello")
        assert off.usage.generated_tokens >= 2  # the closer was generated (forced), then the answer


BUDGETED = r'root ::= "<think>" [a-z]* "</think>" "x"'


async def test_the_budget_forces_its_message_and_the_closer(models: dict[str, Path]) -> None:
    async with Runtime.open(models["qwen3"], n_ctx=1024, n_threads=1) as rt:
        zero = await rt.chat(
            "a", "hi", grammar=BUDGETED, temperature=0, reasoning_budget=0, reasoning_budget_message="done"
        )
        assert (zero.reasoning, zero.text) == ("done", "x")
        two = await rt.chat(
            "b", "hi", grammar=BUDGETED, temperature=0, reasoning_budget=2, reasoning_budget_message="zz"
        )
        # greedy on this model: "<think>", two free tokens "y" "o", then the forced "zz" + "</think>", then "x"
        assert (two.reasoning, two.text) == ("yozz", "x")
        unlimited = await rt.chat("c", "hi", grammar=BUDGETED, temperature=0)
        assert re.fullmatch(r"[a-z]*", unlimited.reasoning) and not unlimited.reasoning.startswith("yozz")


VERDICT = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize("name", ["qwen3", "r1"])
async def test_structured_output_comes_after_the_reasoning_block(models: dict[str, Path], name: str) -> None:
    async with Runtime.open(models[name], n_ctx=1024, n_threads=1) as rt:
        reply = await rt.chat("a", "hi", response_format=VERDICT, temperature=0, reasoning_budget=3, max_tokens=64)
        assert reply.finish_reason == "stop"
        assert isinstance(reply.parsed, dict) and set(reply.parsed) == {"a"}
        assert reply.text.startswith("{") and "think>" not in reply.text
        if name == "r1":  # the generation prompt opened the block: the grammar starts in it, the budget closes it
            assert reply.reasoning != ""


def lookup(city: str) -> str:
    """Look a city up."""
    return city


async def test_a_turn_with_tools_splits_the_reasoning_and_parses_calls_from_the_answer_only(
    models: dict[str, Path],
) -> None:
    async with Runtime.open(models["r1"], n_ctx=1024, n_threads=1) as rt:
        reply = await rt.chat("a", "hi", tools=[lookup], temperature=0, reasoning_budget=2, max_tokens=16)
        assert reply.reasoning != "" and "think>" not in reply.text and "think>" not in reply.reasoning
        s = await rt.get_session("a")
        assert s.messages[-1].reasoning == reply.reasoning


# (template in models/templates, reasoning format, whether its generation prompt opens the block with thinking on,
#  the answer llama-server gives for the output below: its content after `<closer>\n\nhello`, measured with the
#  llama-server built from the same vendored tree, `--jinja --chat-template-file`, the same forced output)
FAMILIES = [
    ("openai-gpt-oss-120b.jinja", "harmony", False, "hello"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "command-r7b", False, "hello"),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "magistral", False, "hello"),
    ("ByteDance-Seed-OSS.jinja", "seed-oss", False, "\nhello"),  # its closer is `</seed:think>\n`
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "granite", False, "\n\nhello"),  # renders no reasoning
    ("HuggingFaceTB-SmolLM3-3B.jinja", "think", False, "\n\nhello"),
    ("Kimi-K2-Thinking.jinja", "think", False, "\n\nhello"),
    ("GLM-4.6.jinja", "think", False, "\nhello"),
    ("google-gemma-4-31B-it.jinja", "gemma4", False, "\n\nhello"),
    ("MiniMax-M3.jinja", "minimax-m3", False, "\n\nhello"),
    # llama-server gives "hello" here: its analysis takes both newlines, the template writes `</think>\n`
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "think", True, "\nhello"),
    ("Qwen3.5-4B.jinja", "think", True, "hello"),
    ("MiniMax-M2.jinja", "granite", True, "hello"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "think", True, "\n\nhello"),
]


@pytest.mark.parametrize(("template", "family", "inside", "answer"), FAMILIES)
async def test_each_family_splits_its_forced_output_as_llama_server_over_two_turns(
    tmp_path: Path, template: str, family: str, inside: bool, answer: str
) -> None:
    """Forced (raw grammar) outputs in each family's syntax give llama-server's reasoning and content; the second
    turn renders the first reply back (gpt-oss's template raised on a stored reply holding its channel markup)."""
    from runtime.grammar.gbnf import format_literal
    from runtime.reasoning import by_name, detect

    source = vendored_template(template)
    fmt = detect(source)
    assert fmt is not None and fmt.name == family
    header = {"harmony": "<|start|>assistant<|channel|>final<|message|>", "command-r7b": "<|START_RESPONSE|>"}
    out = ("" if inside else fmt.start) + "hmm ok" + fmt.end + header.get(family, "\n\n") + "hello"
    grammar = "root ::= " + format_literal(out)
    assert by_name(family).start == fmt.start
    async with Runtime.open(write_thinking(tmp_path / "m.gguf", source), n_ctx=4096, n_threads=1, reasoning="on") as rt:
        first = await rt.chat("a", "hi", grammar=grammar, temperature=0)
        items = [p async for p in rt.stream("a", "again", grammar=grammar, temperature=0)]
        assert (first.reasoning, first.text) == ("hmm ok", answer)
        assert "".join(p for p in items[:-1] if isinstance(p, Reasoning)) == "hmm ok"
        assert "".join(p for p in items[:-1] if not isinstance(p, Reasoning)) == answer
        s = await rt.get_session("a")
        assert [(m.content, m.reasoning) for m in s.messages if m.role == "assistant"] == [(answer, "hmm ok")] * 2
