"""The slot executor: one llama.cpp sequence serving many conversations, one request at a time.

For each request, in llama-server's order (`get_available_slot`, `update_slots`, `process_token`):
prompt cache update (save the slot, load a better state from RAM or disk, evict), prefix reuse (truncate
a transformer's KV cache, or restore a checkpoint for memories that cannot drop a suffix), prefill in
n_batch chunks with checkpoints where llama-server makes them, then decode until EOS, a stop string,
the token limit or cancellation. After any stop, `tokens` equals what the sequence's memory holds.

Synchronous and single-threaded: the scheduler calls `run` from its one worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import structlog

from caches.blocks import BlockStore
from caches.disk.tier import DiskTier
from caches.kvstate import memory_of
from caches.prompt_cache import PromptCache
from caches.shares import Weights, owner_of
from caches.tiered import Fetched, Swap, TieredCache
from caches.tokens import lcp
from runtime.backend.protocol import DecodePaused, PrefillPaused, SlotRequest, SlotResult, SlotStats
from runtime.cache_rules import CacheRuleSet
from runtime.errors import ContextOverflow, InvalidConfig, LlamaDecodeError
from runtime.llama.engine import Engine
from runtime.log import get_logger
from runtime.slot.aborts import abort_check, chunk_aborted
from runtime.slot.commit import LastToken
from runtime.slot.decode import Decoded, Generation, budget_for, preserved_tokens
from runtime.slot.lookup import TurnstileLookup, usable
from runtime.slot.ngram import Drafter, NgramIndex
from runtime.slot.shared import AnyState, StateCodec, held_by_entries, share, state_bytes
from runtime.slot.state import (
    CHECKPOINT_MIN_STEP,
    N_CTX_CHECKPOINTS,
    Checkpoint,
    SlotState,
    find_restore,
    make_room,
)
from runtime.types import SPECULATIVE, CacheRules, CacheSource, Speculative

log = get_logger(__name__)


@dataclass
class _Counters:
    """What the slot counts as it runs, named as in `SlotStats` (the tiered cache counts its own loads)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    checkpoint_restores: int = 0
    draft_n: int = 0
    draft_n_accepted: int = 0


_StateCodec = StateCodec  # its earlier name (tests decode disk states with it)


class Slot:
    """Sequence 0 of an engine's context: prefix reuse, checkpoints, prefill and decode.

    Where states go between requests (RAM prompt cache, disk tier) is the `TieredCache`'s business
    (`self.cache`); the slot asks it once per request.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        cache_ram_bytes: int | None = None,
        disk: DiskTier | None = None,
        similarity: float = 0.1,
        max_checkpoints: int = N_CTX_CHECKPOINTS,
        checkpoint_min_step: int = CHECKPOINT_MIN_STEP,
        cache_rules: CacheRules | CacheRuleSet = "turnstile",
        shared_blocks: int | None = None,
        speculative: Speculative = None,
        weights: Weights | None = None,
    ) -> None:
        """`weights`: the keys' weights the RAM and disk tiers share (`caches.shares`; the disk tier's own)."""
        rules = CacheRuleSet.named(cache_rules)
        if speculative not in SPECULATIVE:
            raise InvalidConfig(f"speculative must be 'ngram' or None, not {speculative!r}")
        self.engine = engine
        self.rules = rules  # what the cache rules do (runtime.cache_rules)
        # shared_blocks: the RAM cache holds states as blocks of that many cells, each shared prefix once
        # (the rules see whole sizes, as before); None: whole copies
        self.blocks = (
            BlockStore(shared_blocks, namespace=f"{engine.fingerprint};{engine.settings_key}".encode())
            if shared_blocks is not None
            else None
        )
        self._memory = memory_of(str(engine.kind), engine.n_swa)
        self.weights = weights if weights is not None else Weights()
        held = held_by_entries if self.blocks is not None and rules.count_shared_bytes else None
        ram: PromptCache[AnyState] | None = (
            PromptCache(cache_ram_bytes, engine.n_ctx, held=held, weights=self.weights)
            if cache_ram_bytes is not None
            else None
        )
        self.max_checkpoints = max_checkpoints if engine.needs_checkpoints else 0
        self.lookup = (
            TurnstileLookup(can_truncate=not self.max_checkpoints, min_shared=rules.min_shared_prefix)
            if rules.longest_state
            else None
        )
        self.cache = TieredCache(
            ram,
            disk,
            StateCodec(self.blocks),
            similarity=similarity,
            retain_partial=rules.retain_partial,
            lookup=self.lookup,
        )
        self.checkpoint_min_step = checkpoint_min_step
        self.tokens: list[int] = []
        self.checkpoints: list[Checkpoint] = []
        self._n = _Counters()
        # n-gram speculation: only where a drafted suffix can be dropped again (a transformer KV cache)
        self.speculative: Speculative = speculative
        self.ngram = NgramIndex()  # mirrors `tokens` (synced before each decode), so it follows swaps
        self.last = LastToken(engine, on=rules.defer_last_token)
        self._rate = 0.0  # seconds per token of the last prefill chunk (what an aborted chunk's kept part took)

    def stats(self) -> SlotStats:
        c = self.cache.stats()
        return SlotStats(
            **asdict(self._n),  # the slot's own counts, named as in SlotStats
            swaps=c.swaps,
            ram_loads=c.ram_loads,
            disk_loads=c.disk_loads,
            checkpoints=len(self.checkpoints),
            slot_tokens=len(self.tokens),
            ram_entries=c.ram_entries,
            ram_bytes=c.ram_bytes,
            ram_held_bytes=c.ram_bytes if self.blocks is None else self._held_bytes(),
        )

    def _held_bytes(self) -> int:
        """What RAM's entries hold together (shared blocks once, checkpoints, states kept whole)."""
        ram = self.cache.ram
        return held_by_entries(ram.entries) if ram is not None else 0

    # --- state ------------------------------------------------------------------------------------

    def _snapshot(self) -> AnyState:
        state = SlotState(self.engine.state_get(), tuple(self.checkpoints))
        return state if self.blocks is None else share(self.blocks, self.tokens, state, self._memory)

    def _state_nbytes(self) -> int:
        return self.engine.state_size() + sum(c.nbytes for c in self.checkpoints)

    def _load(self, fetched: Fetched[AnyState]) -> bool:
        """Move a cached state into the sequence; False: none fetched, or llama.cpp refused it (then empty)."""
        state = fetched.state
        if state is None:
            return False
        if not self.engine.state_set(state_bytes(self.blocks, state)):
            log.warning("cache.load_failed", n_tokens=len(fetched.tokens), nbytes=state.nbytes)
            self.reset()
            return False
        self.tokens = list(fetched.tokens)
        self.checkpoints = list(state.checkpoints)
        return True

    def _use_cache(self, prompt: list[int]) -> Swap:
        """This request's cache step: the tiered cache plans it, the slot carries it out (module doc of
        `caches.tiered`)."""
        kept = None
        if self.lookup is not None:
            n_lcp, n_held = lcp(self.tokens, prompt), len(self.tokens)
            kept = usable(n_lcp, n_held, self.checkpoints, not self.max_checkpoints, self.rules.min_shared_prefix)
        plan = self.cache.plan(self.tokens, prompt, self._state_nbytes() if self.tokens else 0, slot_kept=kept)
        state = None
        if plan.save is not None and plan.save.needs_state:
            try:
                state = self._snapshot()
            except MemoryError:
                log.error("cache.snapshot_failed", n_tokens=len(self.tokens))  # the RAM cache shrinks its limit
        fetched = self.cache.apply(plan, state)
        return self.cache.loaded(fetched, self._load(fetched))

    def reset(self) -> None:
        """Forget everything the sequence holds (llama-server's prompt_clear)."""
        self.last.drop()
        self.engine.seq_rm(-1, -1)
        self.tokens = []
        self.checkpoints = []

    def flush(self) -> int:
        """Write the slot's own state and every RAM entry to the disk tier (on close); bytes written."""
        self.settle()
        state = self._snapshot() if self.tokens and self.cache.keeps_on_close else None
        return self.cache.flush(self.tokens, state)

    def settle(self) -> None:
        """Evaluate the last reply's held token, if any (`runtime.slot.commit`); before the state is read."""
        if not self.last.settle(self.tokens):
            self.reset()

    # --- one request ------------------------------------------------------------------------------

    def check_fits(self, n_prompt: int, max_tokens: int | None, reserve: bool) -> None:
        room = (max_tokens or 0) if reserve else 0
        if n_prompt == 0:
            raise ContextOverflow(0, self.engine.n_ctx)  # an empty prompt cannot be evaluated
        if n_prompt >= self.engine.n_ctx or n_prompt + room > self.engine.n_ctx:
            raise ContextOverflow(n_prompt, self.engine.n_ctx, room)

    def _reuse_prefix(self, prompt: Sequence[int], resumed: bool = False, decoding: bool = False) -> tuple[int, bool]:
        """Prefix reuse: returns (n_past, whether a checkpoint was restored).

        `resumed`: a paused prefill run again. When the slot holds exactly a prefix of its prompt, its memory is
        the one the unpaused prefill had at that chunk boundary, so it continues from there as that prefill
        would, where llama-server's rule would roll a sliding-window memory back to a checkpoint. `decoding`: a paused
        generation run again (`prompt` is what its memory held): when the slot holds all of it, nothing is evaluated
        again (its next token is pending, not in memory).

        A state the prompt does not continue whole (another conversation's) is kept only when what it keeps is at
        least the rules' `min_shared_prefix` tokens (as `lookup.usable` counts it); else the prompt starts afresh."""
        eng = self.engine
        n_past = lcp(self.tokens, prompt)
        other = n_past < len(self.tokens)  # the prompt does not continue the slot's state whole
        least = self.rules.min_shared_prefix if other else 0
        if n_past < least:
            n_past = 0
        pos_next = n_past
        restored = False
        whole = resumed and 0 < n_past == len(self.tokens) and (n_past < len(prompt) or decoding)
        if self.max_checkpoints and 0 < n_past <= len(self.tokens) and not whole:
            has_new = n_past < len(prompt)
            thold = max(0, pos_next - eng.n_swa - (0 if has_new else 1))
            if eng.pos_min() >= thold:
                cp = find_restore(self.checkpoints, pos_next, thold)
                if cp is not None and _restores_to(cp, pos_next) < least:
                    cp = None  # it would keep too few of another conversation's tokens: start afresh
                if cp is not None and eng.state_set(cp.data, partial=True):
                    pos_next = min(pos_next, max(cp.pos_min + 1, cp.pos_max))
                    n_past = _restores_to(cp, pos_next)
                    restored = True
                    self._n.checkpoint_restores += 1
                    log.info("checkpoint.restore", n_tokens=cp.n_tokens, pos_min=cp.pos_min, pos_max=cp.pos_max)
                else:
                    pos_next = n_past = 0
        if self.max_checkpoints:
            self.checkpoints = [c for c in self.checkpoints if c.pos_max <= pos_next]
        if n_past == len(prompt) and n_past > 0 and not decoding:
            n_past -= 1  # the last prompt token is always evaluated, for its logits
        del self.tokens[n_past:]
        if not eng.seq_rm(n_past, -1) and n_past == 0:
            eng.clear()
        return n_past, restored

    def _prefill(self, req: SlotRequest) -> None:
        eng, prompt = self.engine, req.prompt
        n_prompt = len(prompt)
        user_starts = set(req.user_starts)
        last_user = max(req.user_starts, default=-1)
        do_ckpt_model = self.max_checkpoints > 0
        offsets = [min(eng.n_batch, off) for off in (4 + eng.n_ubatch, 4)]
        first = len(self.tokens)
        watch = req.chunks if eng.can_truncate else None  # a chunk may be aborted for a pause (`runtime.slot.aborts`)
        while len(self.tokens) < n_prompt:
            start = len(self.tokens)
            if start > first and req.pause is not None and req.pause(start, n_prompt):
                raise _Paused  # at a chunk boundary: the chunks from here are the ones an unpaused prefill runs
            end = start
            while end < n_prompt and end - start < eng.n_batch:
                end += 1
                if do_ckpt_model:
                    if end in user_starts and (
                        end == last_user
                        or not self.checkpoints
                        or end > self.checkpoints[-1].n_tokens + self.checkpoint_min_step
                    ):
                        break
                    if any(n_prompt == end + off for off in offsets):
                        break
            if do_ckpt_model:
                self._maybe_checkpoint(req, start, end, n_prompt, start in user_starts, start == last_user)
            batch = list(prompt[start:end])
            if watch is not None:
                watch.started(start, n_prompt, len(batch))
            t_chunk = time.perf_counter()
            try:
                eng.decode(batch, start, logits_last=end == n_prompt)
            except LlamaDecodeError as e:
                if watch is not None:
                    watch.ended(False)
                if e.code == 2 and watch is not None and not req.cancel():
                    kept, wasted = chunk_aborted(eng, batch, start, time.perf_counter() - t_chunk, self._rate)
                    self.tokens.extend(batch[:kept])
                    raise _Paused(len(batch) - kept, wasted) from None
                self._after_abort(batch, start)
                if e.code == 2:
                    raise _Cancelled from None
                raise
            if watch is not None:
                watch.ended(True)
            self._rate = (time.perf_counter() - t_chunk) / len(batch)
            self.tokens.extend(batch)
            if req.on_prefill is not None:
                req.on_prefill(len(self.tokens), n_prompt)
        if do_ckpt_model and self.rules.checkpoint_prompt_end:
            self._checkpoint_at_end(req, n_prompt)

    def _checkpoint_at_end(self, req: SlotRequest, n_prompt: int) -> None:
        """Turnstile's rules add one checkpoint to llama-server's: the whole prompt, the end of the generation
        prompt. A template that drops the previous reply's reasoning (Qwen3 and its kind) makes the next prompt
        diverge right there, so the next turn prefills the previous answer and the new message, not 4 more."""
        pos_min, pos_max = self.engine.pos_min(), self.engine.pos_max()
        if pos_min >= 0 and not (self.checkpoints and self.checkpoints[-1].n_tokens == n_prompt):
            self._add_checkpoint(req, n_prompt, pos_min, pos_max)

    def _maybe_checkpoint(
        self, req: SlotRequest, start: int, end: int, n_prompt: int, is_user_start: bool, is_last_user: bool
    ) -> None:
        eng = self.engine
        near_end = n_prompt < end + eng.n_ubatch
        if end != n_prompt and not is_user_start and not near_end:
            return
        pos_min, pos_max = eng.pos_min(), eng.pos_max()
        if pos_min < 0:
            return
        if self.checkpoints and not (
            is_last_user or near_end or start > self.checkpoints[-1].n_tokens + self.checkpoint_min_step
        ):
            return
        self._add_checkpoint(req, start, pos_min, pos_max)

    def _add_checkpoint(self, req: SlotRequest, n_tokens: int, pos_min: int, pos_max: int) -> None:
        kept = make_room(
            self.checkpoints,
            n_tokens,
            req.request_id,
            max_checkpoints=self.max_checkpoints,
            min_step=self.checkpoint_min_step,
        )
        cp = Checkpoint(
            n_tokens=n_tokens,
            pos_min=pos_min,
            pos_max=pos_max,
            data=self.engine.state_get(partial=True),
            request_id=req.request_id,
        )
        self.checkpoints = [*kept, cp]
        log.debug("checkpoint.create", n_tokens=n_tokens, pos_min=pos_min, pos_max=pos_max, nbytes=cp.nbytes)

    def _after_abort(self, batch: Sequence[int], start: int) -> None:
        """Make `tokens` equal to memory again after an aborted or failed decode."""
        eng = self.engine
        if eng.can_truncate:
            done = max(0, eng.pos_max() + 1 - start)
            self.tokens.extend(batch[:done])
            eng.seq_rm(len(self.tokens), -1)
        else:
            # a recurrent state may be half-updated: start this sequence over
            self.reset()

    def run(self, req: SlotRequest) -> SlotResult:
        """Run one request to its end; raises ContextOverflow (nothing changed) or LlamaDecodeError."""
        prompt = list(req.prompt)
        max_tokens = req.sampling.max_tokens
        self.check_fits(len(prompt), max_tokens, req.reserve)
        self.settle()
        with structlog.contextvars.bound_contextvars(session_id=req.session_id, request_id=req.request_id):
            return self._run(req, prompt, max_tokens)

    def _run(self, req: SlotRequest, prompt: list[int], max_tokens: int | None) -> SlotResult:
        t0 = time.perf_counter()
        gen = req.carry
        if gen is not None and not isinstance(gen, Generation):
            raise TypeError(f"carry must be a paused Generation of this slot, not {type(gen).__name__}")
        # what the slot must hold before it goes on: the prompt, or a paused generation's prompt and tokens
        target = gen.held if gen is not None else prompt
        try:
            return self._go(req, prompt, target, gen, t0)
        finally:
            if gen is not None and not gen.paused:
                gen.close()  # it ended (or failed, or was cancelled): never runs again

    def _go(
        self, req: SlotRequest, prompt: list[int], target: list[int], gen: Generation | None, t0: float
    ) -> SlotResult:
        eng = self.engine
        decoding = gen is not None
        swap = self._use_cache(target)
        self.cache.owner = owner_of(req.session_id)  # from here on the slot's state is this request's key's
        source: CacheSource | None = swap.source
        saved, restored = swap.saved, swap.restored
        n_past, from_ckpt = self._reuse_prefix(target, req.resumed, decoding=decoding)
        t_cache = time.perf_counter() - t0
        if n_past == 0:
            source = "none"
        elif from_ckpt:
            source = "checkpoint"
        elif source is None:
            source = "slot"
        log.info("cache.decision", source=source, cached=n_past, prompt=len(target), saved=saved, restored=restored)
        if req.on_start is not None and not decoding:
            req.on_start(len(prompt), n_past)
        if req.on_prefill is not None and not decoding:
            req.on_prefill(n_past, len(prompt))
        if not req.resumed:  # a paused request run again is the same request
            self._n.requests += 1
            self._n.prompt_tokens += len(prompt)
            self._n.cached_tokens += n_past
        eng.set_abort(abort_check(eng, req, decoding))
        done = Decoded("cancelled", None)  # what a cancel during prefill leaves: nothing generated
        if gen is not None:
            done = Decoded("cancelled", gen.out.t_first, gen.out.tokens, gen.out.probs, gen.stops.text)
        t1 = time.perf_counter()
        t_prefill = 0.0
        t2 = t1
        try:
            try:
                if len(self.tokens) < len(target):  # a paused generation's state is whole: nothing to evaluate
                    self._prefill(
                        req if gen is None else replace(req, prompt=target, pause=None, on_prefill=None, chunks=None)
                    )
            finally:
                t_prefill = time.perf_counter() - t1
                self._n.prefilled_tokens += max(0, len(self.tokens) - n_past)
            prefilled = len(self.tokens) - n_past
            log.info("prefill.done", prefilled=prefilled, seconds=round(t_prefill, 4))
            eng.set_abort(None)  # single-token decodes are short: cancel between tokens
            t2 = time.perf_counter()
            if gen is None:
                budget = budget_for(eng, req)
                drafter = None if budget is not None else self._drafter(req)  # a budget forces tokens: no drafts
                on_token = self.ngram.append if drafter is not None else None
                gen = Generation(
                    eng, self.tokens, req, t0, drafter, on_token, budget=budget, preserved=preserved_tokens(eng, req)
                )
            elif gen.drafter is not None:
                self.ngram.sync(self.tokens)  # the index followed other conversations meanwhile
            out = gen.run(self.tokens, req, req.pause_decode)
            if out is None:
                raise _DecodePause
            done = out
        except _Cancelled:
            pass
        except _Paused as p:
            done_n = len(self.tokens)
            log.info(
                "prefill.paused",
                done=done_n,
                prompt=len(prompt),
                seconds=round(t_prefill, 4),
                aborted_tokens=p.tokens,
                aborted_seconds=round(p.seconds, 4),
            )
            raise PrefillPaused(
                done_n,
                len(prompt),
                n_past,
                done_n - n_past,
                t_prefill,
                source,
                aborted_tokens=p.tokens,
                aborted_s=p.seconds,
            ) from None
        except _DecodePause:
            assert gen is not None
            t_decode = time.perf_counter() - t2
            n_gen = len(gen.out.tokens)
            log.info("decode.paused", generated=n_gen, held=len(self.tokens), seconds=round(t_decode, 4))
            raise DecodePaused(
                len(self.tokens),
                len(prompt),
                n_past,
                prefilled,
                t_prefill,
                source,
                generated=n_gen,
                t_decode=t_decode,
                carry=gen,
            ) from None
        finally:
            eng.set_abort(None)
        t_decode = time.perf_counter() - t1 - t_prefill
        finish, draft_n, draft_n_accepted = done.finish, done.draft_n, done.draft_n_accepted
        self._n.generated_tokens += len(done.tokens)
        self._n.draft_n += draft_n
        self._n.draft_n_accepted += draft_n_accepted
        if draft_n:
            log.debug("speculative.done", draft_n=draft_n, draft_n_accepted=draft_n_accepted)
        self.last.hold(self.tokens, done.tokens, finish, done.stopped_by)
        return SlotResult(
            text=done.text,
            finish_reason=finish,
            tokens=done.tokens,
            prompt_tokens=len(prompt),
            cached_tokens=n_past,
            prefilled_tokens=len(target) - n_past,
            cache_source=source,
            bytes_saved=saved,
            bytes_restored=restored,
            t_cache=t_cache,
            t_prefill=t_prefill,
            t_decode=t_decode,
            t_first_token=done.t_first,
            stop_sequence=done.stopped_by if finish == "stop" else None,
            draft_n=draft_n,
            draft_n_accepted=draft_n_accepted,
            probs=tuple(done.probs),
        )

    def _drafter(self, req: SlotRequest) -> Drafter | None:
        """The request's drafter over the conversation's n-gram index (synced to `tokens`), or None (always
        under llama-server's rules: those are the parity runs, whatever the request asks)."""
        on = self.speculative is not None if req.speculative is None else req.speculative
        if not on or not self.rules.speculation or not self.engine.can_truncate:
            return None
        self.ngram.sync(self.tokens)
        return Drafter(self.ngram, ends=self.engine.is_eog)


def _restores_to(cp: Checkpoint, pos_next: int) -> int:
    """Tokens a rollback to `pos_next` keeps when it restores checkpoint `cp` (llama-server's arithmetic)."""
    return min(pos_next, max(cp.pos_min + 1, cp.pos_max), cp.n_tokens)


class _Cancelled(Exception):
    """Internal: the request's cancel check fired during prefill."""


class _Paused(Exception):
    """Internal: the request's pause check said stop at this chunk boundary (or its chunk watch stopped a chunk:
    `tokens` evaluated for nothing in `seconds`)."""

    def __init__(self, tokens: int = 0, seconds: float = 0.0) -> None:
        super().__init__()
        self.tokens = tokens
        self.seconds = seconds


class _DecodePause(Exception):
    """Internal: the request's decode pause check said stop after this token."""
