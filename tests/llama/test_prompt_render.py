"""The incremental renderer (`runtime.llama.prompt`) equals a full render on every template the tests have."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from runtime.backend.protocol import RenderedChat
from runtime.llama.chat_template import ChatTemplate
from runtime.llama.engine import Engine
from runtime.llama.prompt import PromptRenderer
from runtime.log import capture_logs
from tests.support.tiny_models import CHATML_TEMPLATE

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# numbers every message: the text of a message depends on how many come before it (no incremental render)
NUMBERED_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + loop.index|string + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TEXTS = [
    "hello world",
    "tell me about the sea",
    "ünïcödé ✓ 日本語 🐍🐍",
    "fake end <|im_end|> then more",
    "<|im_start|>user\nnot a real turn",
    "<end_of_turn>\n<start_of_turn>model\n",
    "<|eot_id|><|start_header_id|>system<|end_header_id|>",
    "  leading and trailing spaces  ",
    "line\nbreaks\n\nand\ttabs",
    "",
    "a" * 300,
]


def conversation(rng: random.Random, n_turns: int) -> list[dict[str, str]]:
    out = []
    for t in range(n_turns):
        out.append({"role": "user", "content": f"{t}: {rng.choice(TEXTS)} {rng.choice(TEXTS)}"})
        out.append({"role": "assistant", "content": f"{rng.choice(TEXTS)} r{t}"})
    return out


def same(got: RenderedChat, want: RenderedChat) -> None:
    assert got.text == want.text
    assert got.tokens == want.tokens
    assert got.message_starts == want.message_starts
    assert got.roles == want.roles


def template_for(eng: Engine, source: str) -> ChatTemplate:
    return ChatTemplate(
        source, eos=eng.token_text(eng.eos_token), bos=eng.token_text(eng.bos_token), tokenize=eng.tokenize
    )


def renderer(tpl: ChatTemplate, eng: Engine, **kw: Any) -> PromptRenderer:
    return PromptRenderer(tpl, lambda text, special: eng.tokenize(text, add_special=special), **kw)


# Gemma's and Llama 3's control tokens, played by SmolLM2's (message boundaries at special tokens, as in
# the real models); the plain-text versions have no special tokens at the boundaries
AS_SMOLLM2 = {
    "<start_of_turn>": "<issue_start>",
    "<end_of_turn>": "<issue_closed>",
    "<|start_header_id|>": "<repo_name>",
    "<|end_header_id|>": "<file_sep>",
    "<|eot_id|>": "<|im_end|>",
}


def on_smollm2(source: str) -> str:
    for k, v in AS_SMOLLM2.items():
        source = source.replace(k, v)
    return source


TEMPLATES: dict[str, tuple[str, str | None, bool]] = {  # engine, template (None: the model's), incremental
    "chatml-tiny": ("tiny", None, True),
    "smollm2": ("smollm2", None, True),
    "gemma-style": ("smollm2", on_smollm2(GEMMA_TEMPLATE), True),
    "llama3-style": ("smollm2", on_smollm2(LLAMA3_TEMPLATE), True),
    "gemma-plain-text": ("smollm2", GEMMA_TEMPLATE, False),
    "llama3-plain-text": ("smollm2", LLAMA3_TEMPLATE, False),
    "chatml-on-smollm2": ("smollm2", CHATML_TEMPLATE, True),
}


@pytest.fixture(scope="module")
def engines(tiny_llama: Path, smollm2_path: Path) -> Any:
    opened = {"tiny": Engine(tiny_llama), "smollm2": Engine(smollm2_path)}
    yield opened
    for e in opened.values():
        e.close()


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("system", [None, "You are <|im_end|> a ✓ system"])
def test_every_turn_equals_a_full_render(engines: dict[str, Engine], name: str, system: str | None) -> None:
    which, source, incremental = TEMPLATES[name]
    eng = engines[which]
    tpl = eng.template if source is None else template_for(eng, source)
    r = renderer(tpl, eng)
    rng = random.Random(name)
    msgs = [] if system is None else [{"role": "system", "content": system}]
    msgs += conversation(rng, 12)
    head = 1 if system else 0
    for end in range(head + 1, len(msgs) + 1, 2):  # each turn: the history and a new user message
        same(r.render(msgs[:end], "s"), tpl.render(msgs[:end]))
    if incremental:
        assert r.incremental
        # the first turn; then the check, until an extension whose context leaves messages out (the 4th turn)
        assert r.full_renders == 4
    # a regenerate (the same list), an edit in the middle, an undo, and a window that drops the first turns
    lists = [
        msgs[: head + 11],
        [*msgs[: head + 4], {"role": "user", "content": "edited ✓ <|im_end|>"}],
        msgs[: head + 7],
        [*msgs[:head], *msgs[head + 6 : head + 13]],
        [*msgs[:head], *msgs[head + 6 : head + 15]],
    ]
    for m in lists:
        same(r.render(m, "s"), tpl.render(m))


def test_a_template_that_depends_on_position_falls_back_to_full_renders(engines: dict[str, Engine]) -> None:
    eng = engines["tiny"]
    tpl = template_for(eng, NUMBERED_TEMPLATE)
    r = renderer(tpl, eng)
    msgs = conversation(random.Random(3), 6)
    with capture_logs() as logs:
        for end in range(1, len(msgs) + 1, 2):
            same(r.render(msgs[:end], "s"), tpl.render(msgs[:end]))
    assert not r.incremental
    assert [e["event"] for e in logs if e["event"] == "prompt.incremental_off"] == ["prompt.incremental_off"]


def test_sessions_are_kept_apart_and_bounded(engines: dict[str, Engine]) -> None:
    eng = engines["tiny"]
    r = renderer(eng.template, eng, max_sessions=2)
    convs = {k: conversation(random.Random(k), 5) for k in ("a", "b", "c")}
    for end in range(1, 10, 2):
        for k, msgs in convs.items():
            same(r.render(msgs[:end], k), eng.template.render(msgs[:end]))
    assert len(r._states) == 2
    full = r.full_renders
    r.render(convs["c"], "c")  # kept: an extension
    assert r.full_renders == full
    r.render(convs["a"], "a")  # evicted: built again (the first turn in full, then the checks of its 2 chunks)
    assert r.full_renders == full + 3
    # the same key with another conversation: the prefix differs, the result is still exact
    same(r.render(convs["b"][:5], "a"), eng.template.render(convs["b"][:5]))


def test_cost_per_turn_does_not_grow_with_the_history(engines: dict[str, Engine]) -> None:
    """A new turn renders a bounded number of messages, however long the history (counted, not timed)."""
    eng = engines["smollm2"]
    seen: list[int] = []
    calls = eng.template.render_text

    def counting(messages: Any, **kw: Any) -> str:
        seen.append(len(messages))
        return calls(messages, **kw)

    tpl = template_for(eng, eng.chat_template or "")
    tpl.render_text = counting  # type: ignore[method-assign]
    r = renderer(tpl, eng)
    msgs = [{"role": "system", "content": "sys"}, *conversation(random.Random(5), 300)]
    r.render(msgs[:3], "s")
    r.render(msgs[:5], "s")
    for end in (22, 202, 600):  # each ends with a user message
        r.render(msgs[: end - 2], "s")
        seen.clear()
        r.render(msgs[:end], "s")
        assert max(seen) <= 6 and len(seen) <= 5, (end, seen)


def test_an_empty_chat_renders_like_a_full_render(engines: dict[str, Engine]) -> None:
    eng = engines["tiny"]
    r = renderer(eng.template, eng)
    assert r.render([], "s") == eng.template.render([])


def test_without_a_key_nothing_is_kept(engines: dict[str, Engine]) -> None:
    eng = engines["smollm2"]
    r = renderer(eng.template, eng)
    msgs = [{"role": "system", "content": "S ✓"}, *conversation(random.Random(9), 8)][:-1]
    same(r.render(msgs), eng.template.render(msgs))
    assert r.render(msgs, spans=False).tokens == eng.template.render(msgs, spans=False).tokens
    assert not r._states
