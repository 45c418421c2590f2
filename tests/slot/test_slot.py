"""The slot executor on real llama.cpp: cached equals fresh, exact prefill accounting, rollback, cancel."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from caches.disk.tier import DiskTier
from caches.prompt_cache import lcp
from runtime.backend.protocol import SlotRequest, SlotResult
from runtime.config import EngineConfig
from runtime.errors import ContextOverflow
from runtime.llama.engine import Engine
from runtime.slot.executor import Slot
from runtime.types import CacheRules
from sessions import Sampling

GREEDY = Sampling(temperature=0.0)
CFG = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=64, n_batch=256)
TOPICS = ["the sea", "a red ship", "the moon and the stars", "code and tests"]
N_GEN = 8


@dataclass
class Chat:
    """A conversation driven through a slot: messages in, greedy turns out."""

    system: str
    messages: list[dict[str, str]] = field(default_factory=list)

    def request(self, eng: Engine, user: str, stop: tuple[str, ...] = (), **kw: object) -> SlotRequest:
        msgs = [{"role": "system", "content": self.system}, *self.messages, {"role": "user", "content": user}]
        r = eng.render(msgs)
        sampling = GREEDY.with_overrides(max_tokens=N_GEN, stop=stop)
        return SlotRequest(prompt=r.tokens, sampling=sampling, user_starts=r.user_starts, **kw)  # type: ignore[arg-type]

    def commit(self, user: str, res: SlotResult) -> None:
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": res.text}]


def turn_text(c: int, t: int) -> str:
    return f"turn {t}: tell me more about {TOPICS[c % len(TOPICS)]}, please"


def play_fresh(eng: Engine, n_conv: int, n_turn: int) -> dict[tuple[int, int], list[int]]:
    """Each conversation alone, each turn computed from an empty context (no cache, no reuse)."""
    slot = Slot(eng, cache_ram_bytes=None)
    out: dict[tuple[int, int], list[int]] = {}
    for c in range(n_conv):
        chat = Chat(f"You are agent {c}.")
        for t in range(n_turn):
            slot.reset()
            res = slot.run(chat.request(eng, turn_text(c, t)))
            assert res.cached_tokens == 0
            out[c, t] = res.tokens
            chat.commit(turn_text(c, t), res)
    return out


@pytest.mark.parametrize("arch", ["llama", "mamba", "jamba", "gemma3"])
def test_round_robin_through_small_cache_and_disk_equals_fresh(
    arch: str, engines: Callable[[str], Engine], tmp_path: Path
) -> None:
    n_conv, n_turn = 4, 5
    fresh = play_fresh(engines(arch), n_conv, n_turn)
    eng = engines(arch)
    one_state = eng.state_size() or 1
    disk = DiskTier(tmp_path / "disk", fingerprint=eng.fingerprint, settings=eng.settings_key)
    # room in RAM for about one conversation's state: the others go to disk and come back
    slot = Slot(eng, cache_ram_bytes=1, disk=disk)
    chats = [Chat(f"You are agent {c}.") for c in range(n_conv)]
    seen_tokens: dict[int, list[int]] = {}
    sources: list[str] = []
    for t in range(n_turn):
        for c, chat in enumerate(chats):
            req = chat.request(eng, turn_text(c, t))
            res = slot.run(req)
            assert res.tokens == fresh[c, t], f"conversation {c} turn {t} differs"
            if t > 0:
                # its state (prompt + all generated tokens but the last) came back from disk
                have = min(lcp(seen_tokens[c], req.prompt), len(req.prompt) - 1)
                if arch == "llama":
                    assert res.cache_source == "disk"
                    assert res.cached_tokens == have
                    assert res.prefilled_tokens == len(req.prompt) - have
                else:
                    # where the re-rendered reply differs from the generated tokens, a memory that
                    # cannot drop a suffix rolls back to a checkpoint, as llama-server does
                    assert res.cache_source in ("disk", "checkpoint")
                    assert 0 < res.cached_tokens <= have
            sources.append(res.cache_source)
            seen_tokens[c] = [*req.prompt, *res.tokens[:-1]]
            chat.commit(turn_text(c, t), res)
    assert one_state > 0
    assert slot.stats().disk_loads == n_conv * (n_turn - 1)
    if arch != "llama":
        # memories that cannot drop a suffix (recurrent, hybrid, sliding-window) rolled back to checkpoints
        assert slot.stats().checkpoint_restores > 0
        assert "checkpoint" in sources
    disk.close()


def test_ram_cache_returning_conversation_prefills_only_new_tokens(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    slot = Slot(eng, cache_ram_bytes=256 << 20)
    chats = [Chat("You are A."), Chat("You are B.")]
    held: dict[int, list[int]] = {}
    for t in range(3):
        for c, chat in enumerate(chats):
            req = chat.request(eng, turn_text(c, t))
            res = slot.run(req)
            if t == 0:
                assert res.cache_source in ("none", "slot")
            else:
                assert res.cache_source == "ram"
                assert res.cached_tokens == lcp(held[c], req.prompt)
                assert res.prefilled_tokens == len(req.prompt) - lcp(held[c], req.prompt)
            held[c] = [*req.prompt, *res.tokens[:-1]]
            assert slot.tokens == held[c]
            chat.commit(turn_text(c, t), res)
    assert slot.stats().ram_loads == 4


@pytest.mark.parametrize("arch", ["mamba", "jamba"])
def test_regenerate_and_edit_restore_a_checkpoint(arch: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    slot = Slot(eng, cache_ram_bytes=256 << 20)
    chat = Chat("You are a helper.")
    for t in range(2):
        res = slot.run(chat.request(eng, turn_text(0, t)))
        chat.commit(turn_text(0, t), res)
    last_user = turn_text(0, 2)
    first = slot.run(chat.request(eng, last_user))
    # regenerate: the same prompt again; the recurrent state is past it, so a checkpoint rolls back
    req = chat.request(eng, last_user)
    again = slot.run(req)
    assert again.cache_source == "checkpoint"
    assert 0 < again.prefilled_tokens < len(req.prompt)
    assert again.prefilled_tokens <= 4 + 1
    assert again.tokens == first.tokens
    # edit: a different last user message
    edited = chat.request(eng, "turn 2: what about the sun?")
    res = slot.run(edited)
    assert res.cache_source == "checkpoint"
    assert res.prefilled_tokens < len(edited.prompt)
    fresh_eng = engines(arch)
    fresh = Slot(fresh_eng, cache_ram_bytes=None).run(chat.request(fresh_eng, "turn 2: what about the sun?"))
    assert res.tokens == fresh.tokens


@pytest.mark.parametrize("arch", ["llama", "jamba"])
@pytest.mark.parametrize("when", ["prefill", "decode-first", "decode-later"])
def test_cancel_leaves_the_slot_consistent(arch: str, when: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    slot = Slot(eng, cache_ram_bytes=256 << 20)
    chat = Chat("You are a helper. " * 30)  # a long prompt: several prefill batches
    calls = {"n": 0}
    pieces: list[str] = []

    def cancel() -> bool:
        calls["n"] += 1
        if when == "prefill":
            return calls["n"] > 3  # inside llama_decode's graph computations
        return len(pieces) >= (1 if when == "decode-first" else 4)

    req = chat.request(eng, turn_text(0, 0), cancel=cancel, on_piece=pieces.append)
    req.max_tokens = 32
    res = slot.run(req)
    assert res.finish_reason == "cancelled"
    assert eng.pos_max() == len(slot.tokens) - 1
    assert slot.tokens == list(req.prompt[: len(slot.tokens)]) or slot.tokens[: len(req.prompt)] == list(req.prompt)
    nxt = chat.request(eng, turn_text(0, 1))
    after = slot.run(nxt)
    fresh_eng = engines(arch)
    fresh = Slot(fresh_eng, cache_ram_bytes=None).run(chat.request(fresh_eng, turn_text(0, 1)))
    assert after.tokens == fresh.tokens


def test_too_long_prompt_raises_before_anything_changes(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    slot = Slot(eng, cache_ram_bytes=256 << 20)
    chat = Chat("short")
    slot.run(chat.request(eng, "hello"))
    before = list(slot.tokens)
    with pytest.raises(ContextOverflow):
        slot.run(SlotRequest(prompt=[10] * eng.n_ctx, sampling=GREEDY.with_overrides(max_tokens=4)))
    with pytest.raises(ContextOverflow):
        slot.run(SlotRequest(prompt=[10] * 100, sampling=GREEDY.with_overrides(max_tokens=eng.n_ctx), reserve=True))
    assert slot.tokens == before
    assert eng.pos_max() == len(before) - 1


def test_stop_string_is_cut_and_streamed_pieces_add_up(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    slot = Slot(eng, cache_ram_bytes=None)
    chat = Chat("You are a helper.")
    base = slot.run(chat.request(eng, "hello"))
    assert len(base.text) > 3
    stop = base.text[2:4]
    pieces: list[str] = []
    slot.reset()
    res = slot.run(chat.request(eng, "hello", stop=(stop,), on_piece=pieces.append))
    assert res.finish_reason == "stop"
    assert res.text == base.text[: base.text.find(stop)]
    assert "".join(pieces) == res.text


@pytest.mark.parametrize("rules", ["llama-server", "turnstile"])
def test_state_pushed_out_by_the_save_is_found_on_disk_at_once(
    rules: CacheRules, engines: Callable[[str], Engine], tmp_path: Path
) -> None:
    eng = engines("llama")
    a, b = Chat("You are A."), Chat("You are B.")
    probe = Slot(eng, cache_ram_bytes=None)
    probe.run(a.request(eng, turn_text(0, 0)))
    one = probe._state_nbytes()
    probe.reset()
    disk = DiskTier(tmp_path / "disk", fingerprint=eng.fingerprint, settings=eng.settings_key)
    slot = Slot(eng, cache_ram_bytes=one * 3 // 2, disk=disk, cache_rules=rules)  # RAM holds one conversation
    a.commit(turn_text(0, 0), slot.run(a.request(eng, turn_text(0, 0))))
    a_tokens = list(slot.tokens)
    b.commit(turn_text(1, 0), slot.run(b.request(eng, turn_text(1, 0))))  # A saved to RAM
    req = a.request(eng, turn_text(0, 1))
    res = slot.run(req)  # saving B pushes A out of RAM: A must come back from disk, not be recomputed
    # (turnstile's rule chooses A's RAM entry before the save and loads the one in hand; A is on disk too)
    assert res.cache_source == ("disk" if rules == "llama-server" else "ram")
    assert disk.find(a_tokens) is not None
    assert res.cached_tokens == lcp(a_tokens, req.prompt) > len(req.prompt) // 2 - 1
    assert res.prefilled_tokens == len(req.prompt) - res.cached_tokens
    disk.close()
