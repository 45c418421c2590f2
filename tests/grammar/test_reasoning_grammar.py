"""The structured-output grammar of a thinking model, run by llama.cpp's grammar sampler on a tiny vocabulary:
an optional reasoning block (any text without its closer) before the JSON, or the rest of a block the
generation prompt opened; the closer ends the block exactly where the splitter ends it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runtime.grammar.chat import chat_response_grammar, reasoning_rules
from runtime.tools.grammar import ToolGrammar
from tests.support.reasoning_models import write_thinking
from tests.support.tool_models import qwen25_template
from tests.tools.test_tools_grammar import Vocab

SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vocab]:
    v = Vocab(write_thinking(tmp_path_factory.mktemp("think-vocab") / "t.gguf", qwen25_template()))
    yield v
    v.llm.close()


def grammar(inside: bool = False, end: str = "</think>", start: str = "<think>") -> ToolGrammar:
    return ToolGrammar(chat_response_grammar(SCHEMA, "", (start, end), inside), lazy=False)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"a": true}', True),
        ('<think>a < b, </th x <</think>\n\n{"a": false}', True),
        ('<think></think>{"a": true}', True),
        ('<think>x</think> junk {"a": true}', False),
        ('<think>a</think>b</think>{"a": true}', False),  # the block ends at the first closer
        ('<think>never closed {"a": true}', False),
        ('{"a": true}<think>x</think>', False),
    ],
)
def test_an_optional_block_comes_before_the_json(vocab: Vocab, text: str, ok: bool) -> None:
    assert vocab.accepts(grammar(), text) is ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [('hmm\n</think>\n\n{"a": true}', True), ('</think>{"a": false}', True), ('{"a": true}', False)],
)
def test_a_block_the_generation_prompt_opened_is_closed_first(vocab: Vocab, text: str, ok: bool) -> None:
    assert vocab.accepts(grammar(inside=True), text) is ok


def test_closers_with_class_characters_are_escaped(vocab: Vocab) -> None:
    g = grammar(start="[THINK]", end="[/THINK]")
    assert vocab.accepts(g, '[THINK]a [b] [/THIN [/THINK]{"a": true}')
    assert not vocab.accepts(g, '[THINK]a[/THINK]x[/THINK]{"a": true}')
    assert set(reasoning_rules("<|end|>")) == {"reasoning", *(f"reasoning-{k}" for k in range(1, 7))}
