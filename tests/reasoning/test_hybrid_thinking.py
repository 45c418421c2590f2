"""A thinking conversation on a tiny hybrid (Jamba-style) model with Qwen3's real template: the checkpoint at the
end of the generation prompt.

Qwen3's template drops a reply's reasoning once a user message follows it, so each prompt diverges from the
slot's tokens right after the previous generation prompt (`<|im_start|>assistant\\n`), and a hybrid memory cannot
drop the suffix it computed after that point. Under turnstile's rules the slot keeps a checkpoint there: from
turn 2 on a turn prefills exactly the previous answer and its new message. The outputs are forced by a raw GBNF
grammar (a think block, then a free lowercase answer the model's greedy choices decide), and the answers equal
those of the same conversation run alone without that checkpoint (llama-server's rules) and from scratch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.log import capture_logs
from runtime.types import CacheRules
from tests.support.thinking_models import forced_thought, write_hybrid_thinking

pytestmark = pytest.mark.anyio

TURNS = 5
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield write_hybrid_thinking(tmp_path_factory.mktemp("hybrid-thinking") / "qwen3-jamba.gguf")


def question(t: int) -> str:
    return f"question {t}: what is it"


@dataclass
class Turn:
    reasoning: str
    text: str
    prompt: list[int]
    cached: int
    prefilled: int
    source: str
    checkpoints: list[int]  # the slot's checkpoints (n_tokens) after the turn
    restored: list[int]  # checkpoint.restore events' n_tokens


async def play(model: Path, rules: CacheRules, *, from_scratch: bool = False) -> list[Turn]:
    """The conversation alone on a fresh Runtime; `from_scratch`: the slot forgets everything before each turn."""
    out: list[Turn] = []
    async with Runtime.open(model, n_ctx=2048, n_threads=1, cache_rules=rules) as rt:
        slot: Any = rt.backend.slot  # type: ignore[attr-defined]
        for t in range(TURNS):
            if from_scratch:
                slot.reset()
            with capture_logs() as logs:
                r = await rt.chat(
                    "s", question(t), grammar=forced_thought(t, free_answer=True), temperature=0, max_tokens=MAX_TOKENS
                )
            assert r.finish_reason == "stop"
            u = r.usage
            out.append(
                Turn(
                    r.reasoning,
                    r.text,
                    list(slot.tokens[: u.prompt_tokens]),
                    u.cached_tokens,
                    u.prefilled_tokens,
                    r.cache_source,
                    [c.n_tokens for c in slot.checkpoints],
                    [e["n_tokens"] for e in logs if e["event"] == "checkpoint.restore"],
                )
            )
    return out


async def test_each_turn_prefills_the_previous_answer_and_the_new_message(model: Path) -> None:
    turns = await play(model, "turnstile")
    async with Runtime.open(model, n_ctx=2048, n_threads=1) as rt:
        eng: Any = rt.backend.engine  # type: ignore[attr-defined]
        for t in range(1, TURNS):
            prev, cur = turns[t - 1], turns[t]
            n = len(prev.prompt)
            assert cur.prompt[:n] == prev.prompt  # the reasoning dropped: the prompts diverge at prev's end
            new = cur.prompt[n:]
            # exactly the previous answer, then the new message and the generation prompt
            expected = f"{prev.text}<|im_end|>\n<|im_start|>user\n{question(t)}<|im_end|>\n<|im_start|>assistant\n"
            assert b"".join(eng.token_to_piece(x, special=True) for x in new).decode() == expected
            answer = eng.tokenize(prev.text, add_special=False)
            message = eng.tokenize(expected[len(prev.text) :], add_special=False)
            assert new == answer + message
            assert (cur.cached, cur.prefilled) == (n, len(answer) + len(message))
            assert (cur.source, cur.restored) == ("checkpoint", [n])
    assert all(t.reasoning == f"step {i}: think about it\n" and t.text for i, t in enumerate(turns))
    # llama-server's checkpoints (the last user message, 4 tokens before the end) and the prompt's end
    last = turns[-1]
    assert last.checkpoints[-2:] == [len(last.prompt) - 4, len(last.prompt)]


async def test_the_answers_equal_runs_without_the_checkpoint(model: Path) -> None:
    ours = await play(model, "turnstile")
    server = await play(model, "llama-server")
    scratch = await play(model, "turnstile", from_scratch=True)
    assert [(t.reasoning, t.text) for t in ours] == [(t.reasoning, t.text) for t in server]
    assert [(t.reasoning, t.text) for t in ours] == [(t.reasoning, t.text) for t in scratch]
    assert [t.prompt for t in ours] == [t.prompt for t in server] == [t.prompt for t in scratch]
    assert len({t.text for t in ours}) > 1  # the greedy answers differ from turn to turn
    for t in range(1, TURNS):
        n, new = len(ours[t - 1].prompt), len(ours[t].prompt) - len(ours[t - 1].prompt)
        # llama-server's rules: its checkpoint 4 tokens before the end of the previous prompt
        assert (server[t].cached, server[t].prefilled, server[t].restored) == (n - 4, new + 4, [n - 4])
        assert n - 4 in server[t - 1].checkpoints and n not in server[t - 1].checkpoints
        assert (scratch[t].cached, scratch[t].prefilled) == (0, len(ours[t].prompt))
