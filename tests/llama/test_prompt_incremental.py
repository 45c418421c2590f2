"""The incremental renderer equals a full render at every turn on every vendored template, and stays flat on
Qwen3-style templates (the last assistant turn renders differently from earlier ones: with its reasoning, or
an empty think block).

Qwen3's template comes from the vendored llama.cpp tree (tests/support/vendor_tree.py); SmolLM2's vocabulary has the
ChatML control tokens it uses, so message boundaries sit at special tokens as on the real model.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import ChatTemplateError
from runtime.llama.chat_template import ChatTemplate
from runtime.llama.engine import Engine
from runtime.llama.prompt import PromptRenderer
from tests.support.vendor_tree import template_path


def qwen3(eng: Engine, name: str = "Qwen-Qwen3-0.6B.jinja") -> ChatTemplate:
    source = template_path(name).read_text(encoding="utf-8")
    return ChatTemplate(source, eos="<|im_end|>", bos="", tokenize=eng.tokenize)


def turns(n: int) -> list[dict[str, Any]]:
    """system, then n turns: a user message and a reply with its reasoning (every 5th a tool round)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for t in range(n):
        out.append({"role": "user", "content": f"question {t}"})
        if t % 5 == 4:
            call = {"id": f"c{t}", "type": "function", "function": {"name": "f", "arguments": {"x": t}}}
            out.append({"role": "assistant", "content": "", "reasoning_content": f"call f {t}", "tool_calls": [call]})
            out.append({"role": "tool", "tool_call_id": f"c{t}", "content": f"result {t}"})
        out.append({"role": "assistant", "content": f"answer {t}", "reasoning_content": f"thinking {t}"})
    return out


def test_every_turn_equals_a_full_render_and_the_cost_stays_flat(smollm2: Engine) -> None:
    tpl = qwen3(smollm2)
    seen: list[int] = []
    calls = tpl.render_text

    def counting(messages: Any, **kw: Any) -> str:
        seen.append(len(messages))
        return calls(messages, **kw)

    tpl.render_text = counting  # type: ignore[method-assign]
    r = PromptRenderer(tpl, lambda text, special: smollm2.tokenize(text, add_special=special))
    full = qwen3(smollm2)
    msgs = turns(40)
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    cost: list[tuple[int, int]] = []
    for u in users:
        chat = msgs[: u + 1]  # ends with the new user message
        seen.clear()
        got = r.render(chat, "s")
        cost.append((len(seen), max(seen)))
        want = full.render(chat)
        assert (got.text, got.tokens, got.message_starts, got.roles) == (
            want.text,
            want.tokens,
            want.message_starts,
            want.roles,
        ), u
    assert r.incremental
    late = cost[15:]  # past the checks against full renders (each new kind of turn is checked once)
    assert max(n for n, _ in late) <= 9, cost  # renders per turn
    assert max(m for _, m in late) <= 10, cost  # messages per render: a few turns, not the history
    assert cost[-5:] == cost[-10:-5] == cost[15:20], cost  # the same work at turn 15 and at turn 40


def test_every_vendored_template_renders_incrementally_as_in_full(smollm2: Engine) -> None:
    """For every template llama.cpp keeps, each turn of an 11-turn conversation with reasoning and two tool rounds
    equals a full render (text, tokens, message starts). Templates whose text depends on the whole history
    (Kimi K2 numbers tool calls across it, the R1 distills mark the first call) are caught at the first
    extension of a new shape and rendered in full from then on."""
    msgs = turns(11)
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    names = sorted(p.name for p in template_path("x.jinja").parent.glob("*.jinja"))
    assert len(names) == 70
    off: list[str] = []
    for name in names:
        tpl, full = qwen3(smollm2, name), qwen3(smollm2, name)
        r = PromptRenderer(tpl, lambda text, special: smollm2.tokenize(text, add_special=special))
        for u in users:
            try:
                want = full.render(msgs[: u + 1])
            except ChatTemplateError:  # the template refuses this conversation (Gemma 2, Mistral's call ids)
                break
            got = r.render(msgs[: u + 1], "s")
            assert (got.text, got.tokens, got.message_starts) == (want.text, want.tokens, want.message_starts), (
                name,
                u,
            )
        if not r.incremental:
            off.append(name)
    assert off == [
        "Kimi-K2-Instruct.jinja",
        "Kimi-K2-Thinking.jinja",
        "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    ]
