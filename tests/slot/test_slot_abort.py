"""A prefill stopped inside a chunk (llama.cpp's abort check, from the time the request's chunk watch says) on
real llama.cpp: on a transformer the aborted chunk is dropped exactly (whole ubatches before it stay when
n_batch is a multiple of n_ubatch), and the resumed request gives the greedy tokens and cached/prefilled
counts of the unpaused one; recurrent, hybrid and sliding-window models are never aborted for a pause (they
pause at a chunk boundary) and also equal the unpaused run; the check is never asked during decode."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.backend.protocol import ChunkWatch, PrefillPaused, SlotRequest, SlotResult
from runtime.config import EngineConfig
from runtime.llama.engine import Engine
from runtime.log import capture_logs
from runtime.slot.executor import Slot
from sessions import Sampling

CFG = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=32, n_batch=64)
GREEDY = Sampling(temperature=0.0, max_tokens=8)
DOC = " ".join(f"line {i}: the cat and the dog tell me a story about the sea and the ship." for i in range(24))


class Watch:
    """A chunk watch that aborts the chunk starting at or past `at_chunk` tokens on the `node`-th check inside
    it (1: its first graph node), once; it records the chunks and every read of `at`."""

    def __init__(self, at_chunk: int | None = None, node: int = 1) -> None:
        self.at_chunk, self.node = at_chunk, node
        self.chunks: list[tuple[int, int, bool | None]] = []  # (done, tokens, ok)
        self.reads = 0  # checks in all
        self.in_chunk = 0  # checks in the running chunk
        self.fired = False

    @property
    def at(self) -> float:
        self.reads += 1
        self.in_chunk += 1
        done = self.chunks[-1][0] if self.chunks else -1
        if self.at_chunk is not None and not self.fired and done >= self.at_chunk and self.in_chunk >= self.node:
            self.fired = True
            return 0.0  # the past: abort now
        return math.inf

    def started(self, done: int, total: int, tokens: int) -> None:
        self.chunks.append((done, tokens, None))
        self.in_chunk = 0

    def ended(self, ok: bool) -> None:
        done, tokens, _ = self.chunks[-1]
        self.chunks[-1] = (done, tokens, ok)


def long_request(eng: Engine, watch: ChunkWatch | None = None, resumed: bool = False) -> SlotRequest:
    r = eng.render([{"role": "system", "content": "You read documents."}, {"role": "user", "content": DOC}])
    return SlotRequest(r.tokens, GREEDY, r.user_starts, chunks=watch, resumed=resumed)


def other_request(eng: Engine) -> SlotRequest:
    r = eng.render([{"role": "system", "content": "You are a poet."}, {"role": "user", "content": "The moon."}])
    return SlotRequest(r.tokens, GREEDY, r.user_starts)


def nodes_per_chunk(engines: Callable[[str], Engine]) -> int:
    """How many abort checks one full chunk of the long prompt makes (its graph nodes, one per ubatch graph)."""
    eng = engines("llama")
    watch = Watch()
    Slot(eng, cache_ram_bytes=None).run(long_request(eng, watch))
    return watch.reads // len(watch.chunks)  # roughly: the last chunk is shorter


def aborted_then_resumed(eng: Engine, watch: Watch) -> tuple[PrefillPaused, SlotResult, SlotResult]:
    slot = Slot(eng, cache_ram_bytes=0)  # a RAM tier without a limit
    with pytest.raises(PrefillPaused) as info:
        slot.run(long_request(eng, watch))
    paused = info.value
    assert slot.tokens == list(long_request(eng).prompt[: paused.done])  # a valid prefix of the conversation
    assert eng.pos_max() + 1 == paused.done  # the memory holds exactly that prefix
    other = slot.run(other_request(eng))  # swaps the paused state out
    resumed = slot.run(long_request(eng, Watch(), resumed=True))
    return paused, other, resumed


@pytest.mark.parametrize("where", ["first-ubatch", "second-ubatch"])
def test_a_transformer_chunk_aborted_and_resumed_equals_unpaused(where: str, engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    whole = Slot(eng, cache_ram_bytes=0).run(long_request(eng))
    assert whole.prefilled_tokens == whole.prompt_tokens > 4 * CFG.n_batch

    per_ubatch = nodes_per_chunk(engines) // (CFG.n_batch // CFG.n_ubatch)
    node = 1 if where == "first-ubatch" else per_ubatch + per_ubatch // 2  # inside the chunk's second ubatch
    watch = Watch(at_chunk=2 * CFG.n_batch, node=node)
    with capture_logs() as logs:
        paused, other, resumed = aborted_then_resumed(engines("llama"), watch)
    kept = 0 if where == "first-ubatch" else CFG.n_ubatch
    # the chunk from 128 was aborted: its ubatches before the aborted one stay, the rest is thrown away
    assert [c for c in watch.chunks if c[2] is False] == [(2 * CFG.n_batch, CFG.n_batch, False)]
    assert paused.done == 2 * CFG.n_batch + kept and paused.prefilled == paused.done and paused.cached == 0
    assert paused.aborted_tokens == CFG.n_batch - kept and paused.aborted_s > 0
    aborted = [e for e in logs if e["event"] == "prefill.aborted"]
    assert [(e["start"], e["kept"], e["aborted"]) for e in aborted] == [(128, kept, CFG.n_batch - kept)]
    assert other.cached_tokens < 32
    # resumed: the same greedy tokens, no token evaluated twice but the aborted ones, the same counts
    assert resumed.tokens == whole.tokens and resumed.text == whole.text
    assert resumed.cached_tokens == paused.done and resumed.cache_source == "ram"
    assert paused.prefilled + resumed.prefilled_tokens == whole.prefilled_tokens


def test_when_n_batch_is_no_multiple_of_n_ubatch_the_chunk_goes_back_to_its_start(
    make_engine: Callable[..., Engine], tiny_models: dict[str, Path]
) -> None:
    cfg = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=32, n_batch=48)
    engine = lambda: make_engine(tiny_models["llama"], cfg)  # noqa: E731
    eng = engine()
    whole = Slot(eng, cache_ram_bytes=0).run(long_request(eng))
    per_chunk = Watch()
    eng = engine()
    Slot(eng, cache_ram_bytes=None).run(long_request(eng, per_chunk))
    watch = Watch(at_chunk=2 * 48, node=per_chunk.reads // len(per_chunk.chunks) - 1)  # in its last ubatch
    paused, _, resumed = aborted_then_resumed(engine(), watch)
    assert paused.done == 2 * 48 and paused.aborted_tokens == 48  # ubatches 32 + 16: none kept
    assert resumed.tokens == whole.tokens and paused.prefilled + resumed.prefilled_tokens == whole.prefilled_tokens


def test_the_abort_check_is_not_asked_during_decode(engines: Callable[[str], Engine]) -> None:
    eng = engines("llama")
    watch = Watch()
    reads: list[int] = []
    req = long_request(eng, watch)
    req.on_piece = lambda _piece: reads.append(watch.reads)
    res = Slot(eng, cache_ram_bytes=None).run(req)
    assert len(res.tokens) == GREEDY.max_tokens and reads  # (pieces: whole UTF-8 characters)
    assert watch.reads > 0 and set(reads) == {watch.reads}  # every check came before the first token
    assert all(ok for *_, ok in watch.chunks) and sum(n for _, n, _ in watch.chunks) == res.prefilled_tokens


@pytest.mark.parametrize("arch", ["mamba", "jamba", "gemma3"])
def test_other_memories_pause_only_at_a_boundary(arch: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    whole = Slot(eng, cache_ram_bytes=0).run(long_request(eng))
    eng2 = engines(arch)
    slot = Slot(eng2, cache_ram_bytes=0)
    watch = Watch(at_chunk=0)  # would abort every chunk at its first node
    req = long_request(eng2, watch)
    req.pause = lambda done, total: done >= 2 * CFG.n_batch
    with pytest.raises(PrefillPaused) as info:
        slot.run(req)
    paused = info.value
    assert watch.reads == 0 and watch.chunks == []  # never installed, never told of a chunk
    assert paused.aborted_tokens == 0 and paused.done >= 2 * CFG.n_batch  # at a chunk boundary
    assert slot.tokens == list(req.prompt[: paused.done])
    slot.run(other_request(eng2))
    resumed = slot.run(long_request(eng2, Watch(at_chunk=0), resumed=True))
    assert resumed.tokens == whole.tokens
    assert (
        resumed.cached_tokens == paused.done and paused.prefilled + resumed.prefilled_tokens == whole.prefilled_tokens
    )


@pytest.mark.parametrize("arch", ["llama", "mamba", "gemma3"])
def test_a_cancel_inside_a_watched_chunk_cancels(arch: str, engines: Callable[[str], Engine]) -> None:
    eng = engines(arch)
    slot = Slot(eng, cache_ram_bytes=0)
    progress = [0]
    req = long_request(eng, Watch())
    req.on_prefill = lambda done, _total: progress.__setitem__(0, done)
    req.cancel = lambda: progress[0] >= 2 * CFG.n_batch  # from the first graph node of the chunk at 128 on
    res = slot.run(req)
    assert res.finish_reason == "cancelled" and res.tokens == []
    assert eng.pos_max() + 1 == len(slot.tokens) and slot.tokens == list(req.prompt[: len(slot.tokens)])
    again = slot.run(long_request(eng))
    fresh_eng = engines(arch)
    assert again.tokens == Slot(fresh_eng, cache_ram_bytes=None).run(long_request(fresh_eng)).tokens


def test_a_sliding_window_model_with_a_full_cache_is_aborted_exactly(
    make_engine: Callable[..., Engine], tiny_models: dict[str, Path]
) -> None:
    cfg = EngineConfig(n_ctx=2048, n_threads=1, n_ubatch=32, n_batch=64, swa_full=True)  # every cell kept
    eng = make_engine(tiny_models["gemma3"], cfg)
    assert eng.can_truncate and eng.n_swa > 0
    whole = Slot(eng, cache_ram_bytes=0).run(long_request(eng))
    watch = Watch(at_chunk=2 * CFG.n_batch)  # at the first node of the chunk at 128
    paused, _, resumed = aborted_then_resumed(make_engine(tiny_models["gemma3"], cfg), watch)
    assert paused.done == 2 * CFG.n_batch and paused.aborted_tokens == CFG.n_batch
    assert resumed.tokens == whole.tokens and resumed.cached_tokens == paused.done
    assert paused.prefilled + resumed.prefilled_tokens == whole.prefilled_tokens
