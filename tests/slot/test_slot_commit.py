"""A reply's last sampled token is committed into the slot after the reply (turnstile's rules), so the
conversation's next turn reuses the whole previous turn: prompt + every generated token, the
end-of-generation token or the last token at max_tokens included. Real llama.cpp on the tiny models
(transformer, recurrent, hybrid, sliding window); the next prompt is built from the tokens themselves
(prompt + reply + the template's next turn), so the count is exact whatever the reply's text is. And the
Runtime's worker settles the slot when it runs out of jobs, after the reply went out (scripted backend)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import anyio
import anyio.to_thread
import pytest

from runtime import Runtime
from runtime.backend.protocol import GrammarSpec, SlotRequest
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.slot.commit import closers
from runtime.slot.executor import Slot
from runtime.testing import ScriptedBackend
from runtime.types import CacheRules
from sessions import MemoryStore, Sampling

CFG = EngineConfig(n_ctx=1024, n_threads=1, n_ubatch=64, n_batch=256)
GREEDY = Sampling(temperature=0.0)
FIXED = GrammarSpec('root ::= "the sea"')  # a reply that ends on the grammar's end: <|im_end|> is forced


def first_prompt(eng: Engine) -> list[int]:
    return eng.render([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi there"}]).tokens


def next_turn(eng: Engine) -> list[int]:
    """What ChatML writes after a reply's <|im_end|>: the next user message and the generation prompt."""
    return eng.tokenize("\n<|im_start|>user\ntell me more<|im_end|>\n<|im_start|>assistant\n", add_special=False)


def in_memory(slot: Slot) -> int:
    return slot.engine.pos_max() + 1


# the end-of-generation token each greedy tiny model picks at the grammar's end: jamba's is </s>, which ChatML
# never writes after a reply (the next prompt has <|im_end|> there), so it is not committed
EOG_OF = {"llama": 4, "mamba": 4, "jamba": 2, "gemma3": 4}


@pytest.mark.parametrize("arch", ["llama", "mamba", "jamba", "gemma3"])
@pytest.mark.parametrize("ending", ["eog", "length"])
def test_second_turn_reuses_prompt_and_every_generated_token(
    arch: str, ending: str, engines: Callable[[str], Engine]
) -> None:
    eng = engines(arch)
    slot = Slot(eng, cache_ram_bytes=None)
    p1 = first_prompt(eng)
    grammar, sampling = (FIXED, GREEDY) if ending == "eog" else (None, GREEDY.with_overrides(max_tokens=6))
    one = slot.run(SlotRequest(prompt=p1, sampling=sampling, grammar=grammar))
    assert one.finish_reason == ("stop" if ending == "eog" else "length")
    if ending == "eog":
        assert one.text == "the sea" and one.tokens[-1] == EOG_OF[arch]  # after the grammar's text
    else:
        assert len(one.tokens) == 6 and 4 not in one.tokens
    held = ending == "length" or one.tokens[-1] == 4
    # right after the run the last token is held, not evaluated: the reply did not wait for it
    assert slot.tokens == [*p1, *one.tokens[:-1]] and in_memory(slot) == len(slot.tokens)
    slot.settle()  # what the worker does when idle (and what the next run does first)
    assert slot.tokens == [*p1, *(one.tokens if held else one.tokens[:-1])] and in_memory(slot) == len(slot.tokens)
    # the next turn: the reply as ChatML writes it again (its content's tokens, <|im_end|>), then more
    p2 = [*p1, *(one.tokens if ending == "length" else one.tokens[:-1]), 4, *next_turn(eng)]
    two = slot.run(SlotRequest(prompt=p2, sampling=GREEDY.with_overrides(max_tokens=3)))
    total = one.prompt_tokens + one.generated_tokens
    assert two.cached_tokens == (total if held else total - 1)  # exactly: the whole first turn, if it is there
    assert two.prefilled_tokens == len(p2) - two.cached_tokens
    assert two.cache_source == "slot"
    assert in_memory(slot) == len(slot.tokens) == len(p2) + 2  # max_tokens 3: the third is held
    assert slot.last.committed == int(held)


@pytest.mark.parametrize("arch", ["llama", "jamba"])
def test_llama_server_rules_leave_the_last_token_out(arch: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    slot = Slot(eng, cache_ram_bytes=None, cache_rules="llama-server")
    p1 = first_prompt(eng)
    one = slot.run(SlotRequest(prompt=p1, sampling=GREEDY, grammar=FIXED))
    slot.settle()
    assert slot.tokens == [*p1, *one.tokens[:-1]] and in_memory(slot) == len(slot.tokens)
    two = slot.run(
        SlotRequest(prompt=[*p1, *one.tokens, *next_turn(eng)], sampling=GREEDY.with_overrides(max_tokens=2))
    )
    assert two.cached_tokens == one.prompt_tokens + one.generated_tokens - 1  # llama-server's count
    assert slot.last.committed == 0


@pytest.mark.parametrize("rules", ["turnstile", "llama-server"])
def test_a_stop_string_commits_nothing(rules: CacheRules, engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    slot = Slot(eng, cache_ram_bytes=None, cache_rules=rules)
    p1 = first_prompt(eng)
    one = slot.run(SlotRequest(prompt=p1, sampling=GREEDY.with_overrides(stop=("sea",)), grammar=FIXED))
    assert (one.finish_reason, one.text, one.stop_sequence) == ("stop", "the ", "sea")
    slot.settle()  # the stop string's tokens leave the history: its last one is not evaluated
    assert slot.tokens == [*p1, *one.tokens[:-1]] and in_memory(slot) == len(slot.tokens)
    assert slot.last.committed == 0


def test_the_slot_saves_the_settled_state_for_the_next_turn(engines: Callable[[str], Engine]) -> None:
    """Another conversation comes first: the held token is evaluated before the state goes to RAM, so the
    conversation's next turn loads a state that holds its whole first turn."""
    eng = engines("llama")
    slot = Slot(eng, cache_ram_bytes=256 << 20)
    p1 = first_prompt(eng)
    one = slot.run(SlotRequest(prompt=p1, sampling=GREEDY, grammar=FIXED))
    other = eng.render([{"role": "user", "content": "something else entirely"}]).tokens
    slot.run(SlotRequest(prompt=other, sampling=GREEDY.with_overrides(max_tokens=2)))
    (entry,) = slot.cache.ram.entries  # type: ignore[union-attr]
    assert list(entry.tokens) == [*p1, *one.tokens]
    two = slot.run(
        SlotRequest(prompt=[*p1, *one.tokens, *next_turn(eng)], sampling=GREEDY.with_overrides(max_tokens=2))
    )
    assert (two.cache_source, two.cached_tokens) == ("ram", len(p1) + len(one.tokens))


def test_closers_are_what_the_template_writes_after_a_reply(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    assert eng.eog_tokens() == [2, 4]
    assert closers(eng) == frozenset({4})  # ChatML: <|im_end|>, not </s>


class Settling(ScriptedBackend):
    """A scripted backend whose `settle` waits for the test's gate (in the worker thread) and counts calls."""

    def __init__(self) -> None:
        super().__init__(n_ctx=400)
        self.settles = 0
        self.called = threading.Event()
        self.gate = threading.Event()

    def settle(self) -> None:
        self.settles += 1
        self.called.set()
        assert self.gate.wait(30)


async def test_the_worker_settles_once_idle_after_the_reply_went_out() -> None:
    backend = Settling()
    async with Runtime.serve(backend, MemoryStore()) as rt:
        with anyio.fail_after(30):
            reply = await rt.chat("a", "hi")  # delivered although settle cannot finish yet
            assert reply.text == "echo: hi"
            assert await anyio.to_thread.run_sync(backend.called.wait, 30)
            assert backend.settles == 1
            backend.called.clear()
            backend.gate.set()
            async with anyio.create_task_group() as tg:  # two queued at once: no settle between them
                tg.start_soon(rt.chat, "b", "one")
                tg.start_soon(rt.chat, "c", "two")
            assert await anyio.to_thread.run_sync(backend.called.wait, 30)
            assert backend.settles == 2
