"""Windowed conversations on real llama.cpp: tiny llama, mamba and jamba, and SmolLM2 (slow).

Every windowed prompt is checked against a full re-render of the messages it kept, and a windowed
conversation interleaved with others (its state swapped through the RAM cache and the disk tier) must give
exactly the replies it gives alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from runtime import ContextOverflow, Reply, Runtime
from runtime.backend.protocol import WHOLE, RenderedChat, RenderOptions

GEN: dict[str, Any] = {"max_tokens": 8, "temperature": 0.0}


def user_msg(t: int) -> str:
    return f"turn {t}: tell me about the sea ✓ <|im_end|> and the moon"


class Recorder:
    """Wraps a LlamaBackend's `prepare` to keep what each turn was rendered from and to."""

    def __init__(self, rt: Runtime) -> None:
        self.backend = rt.backend
        self._prepare = rt.backend.prepare
        self.calls: list[tuple[str | None, list[dict[str, Any]], RenderedChat]] = []
        setattr(self.backend, "prepare", self)  # noqa: B010  # an instance attribute shadows the method

    def __call__(
        self, messages: Sequence[dict[str, Any]], session_id: str | None = None, options: RenderOptions = WHOLE
    ) -> RenderedChat:
        rendered: RenderedChat = self._prepare(messages, session_id, options)
        self.calls.append((session_id, list(messages), rendered))
        return rendered

    def check_last(self, sid: str, stored: list[dict[str, Any]], reply: Reply) -> None:
        """The last prompt of `sid` is the system message + the kept messages, equal to their full render.

        `stored`: the session's messages after the turn (its reply last)."""
        _, messages, rendered = next(c for c in reversed(self.calls) if c[0] == sid)
        head = 1 if stored[0]["role"] == "system" else 0
        assert messages == [*stored[:head], *stored[head + reply.usage.dropped_messages : -1]]
        full = self.backend.engine.template.render(messages, spans=True)  # type: ignore[attr-defined]
        assert (rendered.text, rendered.tokens, rendered.message_starts) == (
            full.text,
            full.tokens,
            full.message_starts,
        )
        assert reply.usage.prompt_tokens == len(full.tokens)


async def windowed_turns(rt: Runtime, rec: Recorder, sid: str, turns: Sequence[int]) -> list[Reply]:
    out = []
    for t in turns:
        r = await rt.chat(sid, user_msg(t), **GEN)
        rec.check_last(sid, (await rt.get_session(sid)).chat_messages(), r)
        out.append(r)
    return out


async def test_300_windowed_turns_on_a_tiny_model(tiny_llama: Path) -> None:
    async with Runtime.open(tiny_llama, n_ctx=256, n_threads=1, cache_ram_mib=16) as rt:
        # the prompt is compared with the template's render: no replay of generated tokens (a random-weight
        # model's replies are not always tokenized as their text re-tokenizes; runtime.loop.replay)
        rt.set_replay(False)
        rec = Recorder(rt)
        await rt.create_session("w", system="You are a test.", context="window")
        replies = await windowed_turns(rt, rec, "w", range(300))
        dropped = [r.usage.dropped_messages for r in replies]
        assert dropped == sorted(dropped) and dropped[-1] > 500
        assert all(r.finish_reason in ("stop", "length") for r in replies)
        assert len((await rt.get_session("w")).messages) == 600


async def test_error_policy_fails_at_the_same_turn_and_changes_nothing(tiny_llama: Path) -> None:
    async with Runtime.open(tiny_llama, n_ctx=256, n_threads=1, cache_ram_mib=16) as rt:
        tpl: Any = rt.backend.engine.template  # type: ignore[attr-defined]
        await rt.create_session("e", system="You are a test.")
        for t in range(300):
            before = await rt.get_session("e")
            prompt = [*before.chat_messages(), {"role": "user", "content": user_msg(t)}]
            if len(tpl.render(prompt, spans=False).tokens) >= 256:  # what the slot has always refused
                with pytest.raises(ContextOverflow):
                    await rt.chat("e", user_msg(t), **GEN)
                assert await rt.get_session("e") == before
                assert t >= 3
                break
            await rt.chat("e", user_msg(t), **GEN)
        else:
            pytest.fail("the conversation never outgrew the context")


@pytest.mark.parametrize("arch", ["llama", "mamba", "jamba"])
async def test_interleaved_windowed_conversation_equals_it_alone(
    tiny_models: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    """Others run between the windowed conversation's turns, so its state goes to RAM and disk and back.

    At a cut the prompt shares only the system prefix with anything cached, so where its prefill starts
    depends on what the slot holds; the interleaved run keeps the conversation's own state in the slot for
    its cut turns (as alone) and swaps it out before every other turn: the same evaluation order.
    """
    model = tiny_models[arch]
    opts: dict[str, Any] = {"n_ctx": 512, "n_threads": 1, "cache_ram_mib": 1}
    n_turns, others = 40, [f"o{i}" for i in range(9)]
    async with Runtime.open(model, data_dir=tmp_path / "alone", **opts) as rt:
        rec = Recorder(rt)
        await rt.create_session("w", system="You are the windowed one.", context="window")
        alone = await windowed_turns(rt, rec, "w", range(n_turns))
    cuts = {t for t in range(1, n_turns) if alone[t].usage.dropped_messages != alone[t - 1].usage.dropped_messages}
    assert len(cuts) >= 2
    async with Runtime.open(model, data_dir=tmp_path / "mixed", **opts) as rt:
        rec = Recorder(rt)
        await rt.create_session("w", system="You are the windowed one.", context="window")
        for o in others:
            await rt.create_session(o, system=f"You are {o}, another agent.", context="window")
        mixed: list[Reply] = []
        for t in range(n_turns):
            mixed += await windowed_turns(rt, rec, "w", [t])
            if t + 1 not in cuts:
                for o in others:
                    await rt.chat(o, f"{o} says {t}: hello world", **GEN)
        st = rt.stats().slot
        assert st.ram_loads > 0 and st.disk_loads > 0, st
    assert [r.text for r in mixed] == [r.text for r in alone]
    assert [r.usage.dropped_messages for r in mixed] == [r.usage.dropped_messages for r in alone]
    assert [r.usage.prompt_tokens for r in mixed] == [r.usage.prompt_tokens for r in alone]
    assert [r.usage.cached_tokens for r in mixed] == [r.usage.cached_tokens for r in alone]


@pytest.mark.slow
async def test_windowed_turns_on_smollm2(smollm2_path: Path) -> None:
    """120 turns through a 1,024-token window (the 300-turn, n_ctx 2048 run is `benchmarks long-conversation`)."""
    gen = {"max_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    async with Runtime.open(smollm2_path, n_ctx=1024, n_threads=2, cache_ram_mib=64) as rt:
        rec = Recorder(rt)
        await rt.create_session("w", system="You are a helpful assistant.", context="window")
        replies = []
        for t in range(120):
            r = await rt.chat("w", user_msg(t), **gen)
            rec.check_last("w", (await rt.get_session("w")).chat_messages(), r)
            replies.append(r)
        assert all(r.generated_tokens == 32 for r in (x.usage for x in replies))
        assert replies[-1].usage.dropped_messages > 120
