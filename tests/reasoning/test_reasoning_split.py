# ruff: noqa: E501  (raw outputs from test-chat.cpp stay on one line each)
"""The reasoning split per family (raw outputs and expected parses from llama.cpp's tests/test-chat.cpp), streamed
at every cut adding up to the whole, malformed output as plain text; the budget's state machine on plain ints."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.reasoning import (
    Budget,
    BudgetState,
    Reasoning,
    Split,
    Splitter,
    by_name,
    detect,
    join,
    split,
    utf8_complete,
)
from runtime.reasoning.formats import FORMATS

THOUGHTS = Split("I'm\nthinking", "Hello, world!\nWhat's up?")

CASES = [  # (format, generated text, output starts inside the block, expected parse)
    ("think", "<think>I'm\nthinking</think>Hello, world!\nWhat's up?", False, THOUGHTS),  # Qwen3, R1, SmolLM3, Kimi K2
    ("think", "I'm\nthinking\n</think>\nHello, world!\nWhat's up?", True, THOUGHTS),  # Nemotron 3, QwQ (opened)
    (
        "think",
        "Let me think about this...\n</think>\nThe answer is 42.",
        True,
        Split("Let me think about this...", "The answer is 42."),
    ),
    ("think", "</think>Hello, world!", True, Split("", "Hello, world!")),  # QwQ, nothing thought
    ("think", "Hello, world!\nWhat's up?", False, Split("", "Hello, world!\nWhat's up?")),
    (
        "seed-oss",
        "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
        False,
        Split("I'm thinking about the answer", "Hello, world!"),
    ),
    ("magistral", "[THINK]I'm\nthinking[/THINK]Hello, world!\nWhat's up?", False, THOUGHTS),
    (
        "command-r7b",
        "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
        False,
        THOUGHTS,
    ),
    (
        "command-r7b",
        "<|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
        False,
        Split("", "Hello, world!\nWhat's up?"),
    ),
    (
        "harmony",
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?",
        False,
        THOUGHTS,
    ),
    ("harmony", "<|channel|>final<|message|>Hello, world!\nWhat's up?", False, Split("", "Hello, world!\nWhat's up?")),
    (
        "harmony",
        "<|channel|>commentary<|message|>Hello, world!\nWhat's up?",
        False,
        Split("", "Hello, world!\nWhat's up?"),
    ),
    ("harmony", "<|channel|>analysis<|message|>I'm\nthinking", False, Split("I'm\nthinking", "")),  # partial
    ("granite", "<think>I'm\nthinking</think>Hello, world!\nWhat's up?", False, THOUGHTS),
    ("granite", "<think>I'm\nthinking</think><response>Hello, world!\nWhat's up?</response>", False, THOUGHTS),
    ("gemma4", "<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?", False, THOUGHTS),
    # malformed: plain text, tags and all, never a crash
    ("think", "Hello </think> world", False, Split("", "Hello </think> world")),
    ("think", "<thi", False, Split("", "<thi")),
    ("think", "", False, Split("", "")),
    ("think", "<think>never closed", False, Split("never closed", "")),
    ("think", "   \n ", True, Split("", "")),
    ("magistral", "[/THINK][THINK]", False, Split("", "[/THINK][THINK]")),
]


@pytest.mark.parametrize(("name", "text", "inside", "expected"), CASES)
def test_the_split_streamed_at_every_cut_adds_up_to_the_whole(
    name: str, text: str, inside: bool, expected: Split
) -> None:
    fmt = by_name(name)
    assert split(fmt, text, inside=inside) == expected
    for cut in range(len(text) + 1):
        s = Splitter(fmt, inside=inside)
        pieces = s.feed(text[:cut]) + s.feed(text[cut:]) + s.flush()
        assert join(pieces) == expected, cut
    s = Splitter(fmt, inside=inside)
    pieces = [p for ch in text for p in s.feed(ch)] + s.flush()
    assert join(pieces) == expected
    tags = (fmt.start, fmt.end, *fmt.content_prefixes, *fmt.content_suffixes)
    if expected.reasoning or text.startswith(fmt.content_prefixes or (fmt.start,)):  # a parsed reply: no tag leaks
        assert not any(t in p for p in pieces for t in tags)


def test_reasoning_pieces_are_a_str_subclass_and_answer_pieces_plain_str() -> None:
    s = Splitter(by_name("think"))
    pieces = s.feed("<think>ab") + s.feed("c</thi") + s.feed("nk>\n\nxy") + s.flush()
    assert pieces == ["ab", "c", "xy"]
    assert [type(p) for p in pieces] == [Reasoning, Reasoning, str]


def test_a_partial_closer_is_held_back_until_the_next_piece_decides() -> None:
    s = Splitter(by_name("think"), inside=True)
    assert s.feed("abc</th") == ["abc"]
    assert s.feed("x") == ["</thx"]  # not a closer after all: reasoning text
    assert s.feed(" </think>") == []
    assert s.flush() == []


def test_reasoning_format_none_keeps_everything_in_the_answer_with_the_opened_prefix() -> None:
    out = split(by_name("think"), "I'm\nthinking\n</think>\nHello", inside=True, keep=True, prefix="<think>\n")
    assert out == Split("", "<think>\nI'm\nthinking\n</think>\nHello")
    assert split(None, "<think>x</think>y") == Split("", "<think>x</think>y")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [  # llama-server's content with reasoning_format "none" (measured on the vendored templates)
        (
            "harmony",
            "<|channel|>analysis<|message|>hmm ok<|end|><|start|>assistant<|channel|>final<|message|>hello",
            "<|channel|>analysis<|message|>hmm ok<|end|>hello",
        ),
        (
            "command-r7b",
            "<|START_THINKING|>hmm ok<|END_THINKING|><|START_RESPONSE|>hello",
            "<|START_THINKING|>hmm ok<|END_THINKING|>hello",
        ),
        ("magistral", "[THINK]hmm ok[/THINK]\n\nhello", "[THINK]hmm ok[/THINK]\n\nhello"),
        (  # Command R7B's answer markers go, both of them
            "command-r7b",
            "<|START_THINKING|>hmm ok<|END_THINKING|><|START_RESPONSE|>hello<|END_RESPONSE|>",
            "<|START_THINKING|>hmm ok<|END_THINKING|>hello",
        ),
        (  # Granite's `<response>` tags stay, both of them
            "granite",
            "<think>hmm ok</think><response>hello</response>",
            "<think>hmm ok</think><response>hello</response>",
        ),
    ],
)
def test_reasoning_format_none_drops_only_the_answer_headers(name: str, text: str, expected: str) -> None:
    fmt = by_name(name)
    assert split(fmt, text, keep=True) == Split("", expected)
    for cut in range(len(text) + 1):
        s = Splitter(fmt, keep=True)
        assert join(s.feed(text[:cut]) + s.feed(text[cut:]) + s.flush()) == Split("", expected)


def test_the_answer_loses_at_most_the_templates_own_space_after_the_closer() -> None:
    fmt = replace(by_name("think"), space_after="\n")  # Seed-OSS-like: the template writes "</think>\n"
    text = "<think>r</think>\n\nhello"
    assert split(fmt, text) == Split("r", "\nhello")
    for cut in range(len(text) + 1):
        s = Splitter(fmt)
        assert join(s.feed(text[:cut]) + s.feed(text[cut:]) + s.flush()) == Split("r", "\nhello")
    assert split(replace(fmt, space_after=""), text).content == "\n\nhello"  # a template that drops reasoning
    assert split(replace(fmt, space_after="\n "), "<think>r</think> x").content == "x"  # each space optional


def cuts(fmt_name: str, text: str, **kw: object) -> set[Split]:
    """The split of `text` fed in two pieces at every cut (one value when streaming adds up to the whole)."""
    fmt = by_name(fmt_name) if fmt_name in {f.name for f in FORMATS} else None
    out = set()
    for cut in range(len(text) + 1):
        s = Splitter(fmt, **kw)  # type: ignore[arg-type]
        out.add(join(s.feed(text[:cut]) + s.feed(text[cut:]) + s.flush()))
    return out


def test_an_empty_block_the_generation_prompt_wrote_is_parsed_before_the_output() -> None:
    """Thinking off on Qwen3 / SmolLM3 / GLM: the generation prompt ends with an empty block; llama-server parses
    the output as if it followed that block ("none" keeps the block in the content)."""
    qwen3 = replace(by_name("think"), space_after="\n\n", space_after_start="\n", trim=False)
    assert cuts("think", "hello", prefix="<think>\n\n</think>\n\n") == {Split("", "hello")}
    assert split(qwen3, "hello", prefix="<think>\n\n</think>\n\n") == Split("", "hello")
    smol = replace(qwen3, space_after="")  # SmolLM3 renders no reasoning: `</think>` takes no whitespace
    assert split(smol, "hello", prefix="<think>\n\n</think>\n") == Split("", "\nhello")
    assert split(qwen3, "hello", prefix="<think>\n\n</think>\n\n", keep=True) == Split(
        "", "<think>\n\n</think>\n\nhello"
    )
    assert cuts("think", "hello", prefix="<think></think>", keep=True) == {Split("", "<think></think>hello")}


def test_closes_block_is_an_empty_block_at_the_end_of_the_prompt() -> None:
    fmt = by_name("think")
    assert fmt.closes_block("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert fmt.closes_block("<｜Assistant｜><think></think>")
    assert not fmt.closes_block("<|im_start|>assistant\n<think>\n")
    assert not fmt.closes_block("<think>\nstep</think>")  # reasoning in it: not a generation prompt's block
    assert not fmt.closes_block("<|im_start|>assistant\n")


def test_granite_unwraps_its_response_tags_only_after_a_block() -> None:
    assert cuts("granite", "<think>hmm ok</think><response>hello</response>") == {Split("hmm ok", "hello")}
    assert cuts("granite", "<response>hello</response>") == {Split("", "<response>hello</response>")}


APRIEL_PROMPT = "<|begin_user|>\nhi\n<|begin_assistant|>\nHere are my reasoning steps:\n"


def test_apriel_reasoning_starts_with_the_generation_prompts_preamble() -> None:
    fmt = by_name("apriel")
    assert fmt.opens_block(APRIEL_PROMPT) and not fmt.opens_block("<|begin_user|>\nhi\n<|begin_assistant|>\n")
    prefix = APRIEL_PROMPT[APRIEL_PROMPT.rfind(fmt.start) :]
    text = "hmm ok\n[BEGIN FINAL RESPONSE]\nhello"
    expected = Split("Here are my reasoning steps:\nhmm ok\n", "hello")
    assert cuts("apriel", text, inside=True, prefix=prefix) == {expected}
    kept = Split("", "<|begin_assistant|>\nHere are my reasoning steps:\nhmm ok\n[BEGIN FINAL RESPONSE]\nhello")
    assert cuts("apriel", text, inside=True, prefix=prefix, keep=True) == {kept}


def test_detect_names_the_family_of_a_template() -> None:
    assert detect(None) is None and detect("{{ messages }}") is None
    assert detect("{{ '<think>\\n' }}").name == "think"  # type: ignore[union-attr]
    assert detect("<|channel|>analysis<|message|>").name == "harmony"  # type: ignore[union-attr]
    assert detect("<|START_THINKING|> <think>").name == "command-r7b"  # type: ignore[union-attr]
    assert detect("[THINK]").name == "magistral"  # type: ignore[union-attr]
    assert detect("<seed:think>").name == "seed-oss"  # type: ignore[union-attr]
    assert detect("<think> <response>").name == "granite"  # type: ignore[union-attr]
    assert detect("'Here are my reasoning steps:\\n' <think>").name == "apriel"  # type: ignore[union-attr]
    assert len({f.name for f in FORMATS}) == len(FORMATS)


def test_opens_block_reads_the_end_of_the_generation_prompt() -> None:
    fmt = by_name("think")
    assert fmt.opens_block("<|im_start|>assistant\n<think>\n")
    assert not fmt.opens_block("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not fmt.opens_block("<|im_start|>assistant\n")


# tokens are ints whose text is TEXT[token]: 1 the opener, 2 3 the closer in two tokens, 9 a message
START, END, MSG = [1], [2, 3], [9]
TEXT = {1: "<t>", 2: "</", 3: "t>", 5: "q", 6: "r", 7: "s", 8: "u", 9: "m", 50: "\xe2", 51: "\x82"}


def budget(forced: list[int], n: int, inside: bool = False) -> Budget:
    return Budget("<t>", "</t>", forced, n, inside=inside)


def run_budget(b: Budget, sampled: list[int]) -> list[int]:
    """Tokens generated when the model would sample `sampled` in order (forced tokens replace samples)."""
    out: list[int] = []
    it = iter(sampled)
    while len(out) < len(sampled):
        forced = b.forced()
        tok = forced if forced is not None else next(it)
        b.accept(TEXT[tok])
        out.append(tok)
    return out


def test_the_budget_forces_message_and_closer_after_n_tokens_inside_the_block() -> None:
    b = budget(MSG + END, 3)
    assert run_budget(b, [5, 1, 7, 7, 7, 7, 7, 8, 8]) == [5, 1, 7, 7, 7, 9, 2, 3, 7]
    assert b.state is BudgetState.DONE


def test_a_closer_spelled_in_several_tokens_is_seen_in_their_text() -> None:
    b = budget(END, 5, inside=True)
    for piece in ["ab", "</", "t", ">"]:
        b.accept(piece)
    assert b.state is BudgetState.DONE and b.remaining == 2  # the closer's first tokens counted


def test_a_natural_closer_ends_counting_and_a_new_opener_rearms() -> None:
    b = budget(END, 3)  # the closer's first token counts, as in llama-server
    assert run_budget(b, [1, 7, 2, 3, 6, 6, 6]) == [1, 7, 2, 3, 6, 6, 6]
    assert b.state is BudgetState.DONE
    assert run_budget(b, [1, 7, 7, 7, 5]) == [1, 7, 7, 7, 2]


def test_budget_zero_inside_an_opened_block_closes_it_at_once() -> None:
    b = budget(END, 0, inside=True)
    assert run_budget(b, [7, 7, 7]) == [2, 3, 7]


def test_the_budget_waits_for_a_character_to_complete() -> None:
    b = budget(END, 1, inside=True)
    b.accept("", complete=False)
    assert b.state is BudgetState.WAITING_UTF8 and b.forced() is None
    b.accept("€", complete=True)
    assert b.forced() == 2


def test_utf8_complete() -> None:
    assert utf8_complete(b"abc") and utf8_complete("é".encode()) and utf8_complete("€".encode())
    assert not utf8_complete("€".encode()[:2]) and not utf8_complete(b"a\xf0\x9f")


def test_in_block_is_true_from_the_opener_until_the_closer_is_done() -> None:
    b = budget(END, 1 << 20)  # a lazy grammar's tracker: no limit
    seen = []
    for tok in [5, 1, 7, 2, 3, 6]:
        b.accept(TEXT[tok])
        seen.append(b.in_block)
    assert seen == [False, True, True, True, False, False]
