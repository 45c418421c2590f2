"""The incremental renderer with template variables (`template_kwargs`, `tools`): with the same variables on every
turn it stays incremental (flat per turn) and equals a full render with those variables; a turn with other
variables rebuilds the state (one full render) and still equals a full render. Through a Runtime, a conversation
with a template switch (`reasoning="off"`: `enable_thinking=False`) takes the incremental path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.llama.chat_template import ChatTemplate
from runtime.llama.engine import Engine
from runtime.llama.prompt import PromptRenderer
from tests.llama.test_prompt_incremental import qwen3, turns
from tests.support.reasoning_models import vendored_template, write_thinking

OFF = {"enable_thinking": False}
TOOLS = [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {"type": "object"}}}]


def _counting(tpl: ChatTemplate, seen: list[int]) -> None:
    calls = tpl.render_text

    def counting(messages: Any, **kw: Any) -> str:
        seen.append(len(messages))
        return calls(messages, **kw)

    tpl.render_text = counting  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "variables", [{"template_kwargs": OFF}, {"tools": TOOLS}, {"tools": TOOLS, "template_kwargs": OFF}]
)
def test_constant_variables_render_incrementally_and_equal_a_full_render(
    smollm2: Engine, variables: dict[str, Any]
) -> None:
    tpl, full = qwen3(smollm2), qwen3(smollm2)
    seen: list[int] = []
    _counting(tpl, seen)
    r = PromptRenderer(tpl, lambda text, special: smollm2.tokenize(text, add_special=special))
    msgs = turns(30)
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    cost: list[tuple[int, int]] = []
    for u in users:
        seen.clear()
        got = r.render(msgs[: u + 1], "s", **variables)
        cost.append((len(seen), max(seen)))
        want = full.render(msgs[: u + 1], **variables)
        assert (got.text, got.tokens, got.message_starts) == (want.text, want.tokens, want.message_starts), u
    assert r.incremental
    late = cost[15:]
    assert max(n for n, _ in late) <= 9, cost  # renders per turn, as without variables
    assert max(m for _, m in late) <= 10, cost  # messages per render: a few turns, not the history
    assert cost[-5:] == cost[-10:-5] == cost[15:20], cost
    if "template_kwargs" in variables:  # the variable reached every render: Qwen3's "off" block is rendered
        assert got.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_other_variables_rebuild_the_state(smollm2: Engine) -> None:
    tpl, full = qwen3(smollm2), qwen3(smollm2)
    r = PromptRenderer(tpl, lambda text, special: smollm2.tokenize(text, add_special=special))
    msgs = turns(20)
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    fulls: list[int] = []
    for t, u in enumerate(users):
        kwargs = OFF if t < 10 else {"enable_thinking": True}  # the switch changes at turn 10
        before = r.full_renders
        got = r.render(msgs[: u + 1], "s", template_kwargs=kwargs)
        want = full.render(msgs[: u + 1], template_kwargs=kwargs)
        assert (got.text, got.tokens, got.message_starts) == (want.text, want.tokens, want.message_starts), t
        fulls.append(r.full_renders - before)
    # the first turns are checked against full renders (as for any new state), then none while the variables stay;
    # with new ones the state is rebuilt from the whole history (which today ends in full renders for a long one)
    assert fulls[5:10] == [0] * 5 and fulls[10] > 0, fulls
    assert r.incremental


@pytest.mark.anyio
async def test_a_runtime_with_a_template_switch_takes_the_incremental_path(tmp_path: Path) -> None:
    model = write_thinking(tmp_path / "q.gguf", vendored_template("Qwen-Qwen3-0.6B.jinja"))
    async with Runtime.open(model, n_ctx=2048, n_threads=1, reasoning="off") as rt:
        prompts: Any = rt.backend.prompts  # type: ignore[attr-defined]
        fulls: list[int] = []
        for i in range(10):
            before = prompts.full_renders
            reply = await rt.chat("a", f"question {i}", grammar='root ::= "ok"', temperature=0)
            assert reply.text == "ok"
            fulls.append(prompts.full_renders - before)
        s = await rt.get_session("a")
        want = rt.backend.engine.template.render(  # type: ignore[attr-defined]
            [*s.chat_messages(), {"role": "user", "content": "next"}], template_kwargs=OFF
        )
        got = rt.backend.prepare([*s.chat_messages(), {"role": "user", "content": "next"}], "a", template_kwargs=OFF)
        assert (got.text, got.tokens) == (want.text, want.tokens)
        assert got.text.endswith("<think>\n\n</think>\n\n")
        assert prompts.extensions >= 10  # each turn extended the session's state
        assert fulls[6:] == [0] * 4, fulls  # past the first turns' checks: no full render (there was one per turn)
