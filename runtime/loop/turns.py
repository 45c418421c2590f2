"""One turn, from a queued job to a committed reply: load the session, render, run the slot, commit.

Commit is the last step and is all-or-nothing with the caller's outcome: the store writes the turn only
if the job has not been withdrawn (checked under the store's lock), and a job withdrawn after its write
(the caller cancelled or timed out while the reply was on its way) gets the write undone by the
scheduler (`Job.undo`). A session used for the first time is created by its first committed turn.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from runtime.backend.protocol import RenderedChat, RenderOptions, SlotBackend, SlotRequest, SlotResult
from runtime.errors import SessionNotFound
from runtime.log import get_logger
from runtime.loop import turn_kinds
from runtime.loop.activity import Activity
from runtime.loop.constraints import Finished
from runtime.loop.context import ContextPolicy, ContextWindow
from runtime.loop.fair import namespace_of
from runtime.loop.policy import Cost
from runtime.loop.replay import Replay, Spliced, same_reply
from runtime.loop.scheduler import Job
from runtime.loop.stream import CallStream, Pieces
from runtime.loop.turn_kinds import CompletePrompt, Turn, new_chars
from runtime.reasoning import REASONING_FIELDS, Reasoning, ReasoningOptions, Split, Splitter, join
from runtime.reply import ProbText, Reply, Timings, TokenProb, Usage
from runtime.tools import reply_seed
from runtime.tools.plan import ToolPlan
from runtime.types import speculation_flag
from sessions import Sampling, Session, history
from sessions.store import SessionStore

log = get_logger(__name__)

StoreCall = Callable[..., Awaitable[Any]]
SlotCall = Callable[..., Awaitable[Any]]


CHARS_PER_TOKEN = 4  # a rough estimate of English text, for the fair policy's predicted cost


def predicted_cost(turn: Turn) -> Cost:
    """A turn's predicted cost when it is queued (the fair policy's): the tokens of what is new in it
    (`turn_kinds.new_chars`), estimated from characters, and its max_tokens (0 when the turn sets none)."""
    limit = turn.overrides.get("max_tokens")
    return Cost(new_chars(turn) // CHARS_PER_TOKEN + 1, limit if isinstance(limit, int) and limit > 0 else 0)


def with_probs(parts: list[str], probs: tuple[TokenProb, ...]) -> list[str]:
    """The split parts of a token's text, its probabilities on the last answer part (none: they are not streamed,
    as llama-server streams a token's probabilities only with the text it adds)."""
    for i in range(len(parts) - 1, -1, -1):
        if not isinstance(parts[i], Reasoning) and parts[i]:
            return [*parts[:i], ProbText(parts[i], probs), *parts[i + 1 :]]
    return parts


@dataclass
class Said:
    """A chat turn's text split so far, kept on its job while its generation is paused (`Job.kept`)."""

    splitter: Splitter
    said: list[str]
    first: list[bool]


class TurnRunner:
    """Runs turns for the Runtime: store calls through `store_call`, slot work through `slot_call`."""

    def __init__(
        self,
        backend: SlotBackend,
        store: SessionStore,
        store_call: StoreCall,
        slot_call: SlotCall,
        context: ContextPolicy = "error",
        reasoning: ReasoningOptions | None = None,
    ) -> None:
        self.backend = backend
        self.context: ContextPolicy = context  # the policy of sessions that set none
        self.reasoning = reasoning if reasoning is not None else ReasoningOptions()  # the runtime's controls
        self.window = ContextWindow()
        self.store = store
        self._store = store_call
        self._in_slot = slot_call
        self.last_key: dict[str, int] = {}  # for the affinity policy: each session's slot key after its turn
        self.last_session: str | None = None
        self.replay: Replay | None = Replay()  # generated replies replayed as generated (None: off)
        self.activity = Activity()  # the running request's phase, for watchers (Runtime.engine_view)

    async def run(self, job: Job[Reply], turn: Turn) -> Reply:
        sid = job.session_id
        with structlog.contextvars.bound_contextvars(session_id=sid, request_id=job.id):
            if not turn.commit:
                session, existed = Session.new(sid), False
            else:
                session, existed = await self._session_for(sid, create=turn.creates)
            pending = turn_kinds.pending(turn, session, existed)
            sampling = session.sampling.with_overrides(**turn.overrides) if turn.overrides else session.sampling
            if turn.constraints.stops:
                sampling = sampling.with_overrides(stop=(*sampling.stop, *turn.constraints.stops))
            log.info(
                "request.started", kind=str(turn.kind), queued=round((job.started or job.submitted) - job.submitted, 4)
            )
            pieces = self._sink(turn, reply_seed(job.id))
            policy = pending.context or self.context
            key = sid if turn.commit else None
            result, parts = await self._in_slot(self._run_in_slot, job, pending, sampling, turn, pieces, policy, key)
            if result.finish_reason == "cancelled" or job.cancelled:
                return self._reply(job, result, session.revision)
            done = turn.constraints.finish(parts.content, result.finish_reason, seed=reply_seed(job.id))
            done = dataclasses.replace(done, reasoning=parts.reasoning)
            if isinstance(pieces, CallStream):  # the pieces add up to the reply, ids included
                done = dataclasses.replace(done, tool_calls=pieces.finish(done.text, done.tool_calls))
            if not turn.commit:
                if isinstance(turn, CompletePrompt):
                    done = dataclasses.replace(done, tokens=tuple(result.tokens))
                return self._reply(job, result, session.revision, done)
            new = history.append_reply(pending, done.text, tool_calls=done.tool_calls, reasoning=done.reasoning)
            committed: Session | None = await self._store(
                self.store.commit, new, expected_revision=session.revision if existed else None, unless=job.is_cancelled
            )
            if committed is None:  # withdrawn while the write was due: nothing written
                return self._reply(job, result, session.revision, done)
            job.undo = self._undo(sid, session if existed else None, committed.revision)
            log.info(
                "request.done",
                finish=result.finish_reason,
                prompt=result.prompt_tokens,
                cached=result.cached_tokens,
                prefilled=result.prefilled_tokens,
                generated=result.generated_tokens,
                source=result.cache_source,
            )
            return self._reply(job, result, committed.revision, done)

    def _undo(self, sid: str, previous: Session | None, revision: int) -> Callable[[], Awaitable[None]]:
        async def undo() -> None:
            if not await self._store(self.store.revert, sid, previous, expected_revision=revision):
                log.warning("session.revert_failed", session_id=sid, revision=revision)

        return undo

    async def _session_for(self, sid: str, *, create: bool) -> tuple[Session, bool]:
        """The stored session and True, or (chat only) a new one, not stored yet, and False."""
        try:
            return await self._store(self.store.get, sid), True
        except SessionNotFound:
            if not create:
                raise
            return Session.new(sid), False

    @staticmethod
    def _sink(turn: Turn, seed: str) -> Pieces | CallStream | None:
        """Where the turn's pieces go: straight to its stream, or, when tools are offered, through a
        `CallStream` that reads the answer as the format does under the turn's choice (`ToolPlan.partial`: text
        and call pieces; under "none" or the agent loop's "answer" the text, unwrapped where the format wraps
        it, as the generic JSON protocol's `{"response": ...}`)."""
        plan = turn.constraints.tools
        if turn.pieces is None or plan is None:
            return turn.pieces
        return CallStream(turn.pieces, lambda text: plan.partial(text, seed=seed))

    def count(self, conversation: Session, overrides: dict[str, Any], tools: ToolPlan | None) -> int:
        """Worker thread: the token count of the prompt a turn answering `conversation` renders (all of it: no
        context window), with the turn's reasoning controls and tools. Renders for no session (nothing kept)."""
        sampling = conversation.sampling.with_overrides(**overrides) if overrides else conversation.sampling
        variables = self._controls(sampling).template_variables(self.backend.reasoning_format())
        return len(self._render_whole(conversation.chat_messages(), variables, tools, spans=False).tokens)

    def _controls(self, sampling: Sampling) -> ReasoningOptions:
        """The turn's reasoning controls: the turn's or the session's, over the runtime's."""
        return ReasoningOptions.from_values({n: getattr(sampling, n) for n in REASONING_FIELDS}, self.reasoning)

    def _render_whole(
        self, messages: list[dict[str, Any]], variables: dict[str, Any], tools: ToolPlan | None, *, spans: bool = True
    ) -> RenderedChat:
        """The whole conversation rendered for no session (with the tools' plan, when tools are offered)."""
        if tools is None:
            return self.backend.prepare(messages, options=RenderOptions(spans, template_kwargs=variables or None))
        plan = tools.render_plan(messages)
        kwargs = {**variables, **(plan.kwargs or {})}
        return self.backend.prepare(plan.messages, options=RenderOptions(spans, plan.tools, kwargs or None))

    def _run_in_slot(
        self,
        job: Job[Reply],
        pending: Session,
        sampling: Sampling,
        turn: Turn,
        pieces: Pieces | CallStream | None,
        context: ContextPolicy = "error",
        key: str | None = None,
    ) -> tuple[SlotResult, Split]:
        """Worker thread: choose the prompt's messages (the context policy), render, tokenize, run the slot;
        the result and the reply's text split into reasoning and answer (streamed as split)."""
        if isinstance(turn, CompletePrompt):
            return self._run_prompt(job, sampling, turn, pieces)
        with structlog.contextvars.bound_contextvars(session_id=job.session_id, request_id=job.id):
            self.activity.start(job.id)
            messages = pending.chat_messages()
            fmt = self.backend.reasoning_format()
            opts = self._controls(sampling)
            variables = opts.template_variables(fmt)
            tools = turn.constraints.tools
            if tools is not None:  # tools: the whole history (the window does not cut turns that offer tools)
                rendered = self._render_whole(messages, variables, tools)
                dropped = 0
            else:
                prompt = self.window.prepare(
                    self.backend, key, messages, context, sampling.max_tokens, variables or None
                )
                rendered, dropped = prompt.rendered, prompt.dropped
            inside = fmt is not None and fmt.opens_block(rendered.text)
            wrote = fmt is not None and (inside or fmt.closes_block(rendered.text))  # the prompt has the block
            prefix = rendered.text[rendered.text.rfind(fmt.start) :] if fmt is not None and wrote else ""
            if job.decoding and isinstance(job.kept, Said):  # a paused generation goes on: so does its text
                splitter, said, first = job.kept.splitter, job.kept.said, job.kept.first
            else:
                splitter, said, first = Splitter(fmt, inside=inside, keep=opts.keep, prefix=prefix), [], [True]
                job.kept = Said(splitter, said, first)

            def emit(parts: list[str]) -> None:
                said.extend(parts)
                if pieces is not None:
                    pieces.feed(parts)

            def on_piece(piece: str) -> None:
                self.activity.piece(job.id)
                if first[0]:
                    first[0] = False
                    log.info("request.first_token")
                parts = splitter.feed(piece)
                if isinstance(piece, ProbText):  # a token's probabilities go with the answer text it made
                    parts = with_probs(parts, piece.probs)
                emit(parts)

            grammar = turn.constraints.grammar
            spliced = Spliced(rendered.tokens)
            if self.replay is not None:
                same = same_reply(self.backend.token_piece, tools, fmt)
                spliced = self.replay.splice(rendered.tokens, same, namespace_of(job.session_id))
            req = SlotRequest(
                prompt=spliced.tokens,
                sampling=sampling,
                user_starts=spliced.shift(rendered.user_starts),
                cancel=job.is_cancelled,
                on_piece=on_piece,
                on_start=pieces.started if pieces is not None else None,
                on_prefill=lambda done, total: self._prefilled(job, pieces, done, total),
                request_id=job.id,
                session_id=job.session_id,
                grammar=grammar,
                speculative=speculation_flag(sampling.speculative),  # the turn's, else the session's, else the slot's
                budget=opts.budget_for(fmt, inside, track=grammar is not None and grammar.lazy),
                preserved=fmt.tags if fmt is not None else (),
                pause=job.pause_check,
                resumed=bool(job.pauses),
                pause_decode=job.decode_check,
                chunks=job.chunks,
                carry=job.carry.carry if job.carry is not None else None,
            )
            try:
                result = dataclasses.replace(self.backend.run(req), dropped_messages=dropped)
            finally:
                self.activity.stop(job.id)
            if self.replay is not None:
                at_eog = result.finish_reason == "stop" and result.stop_sequence is None
                self.replay.remember(
                    spliced.tokens, result.tokens, at_eog=at_eog, namespace=namespace_of(job.session_id)
                )
            self.last_key[job.session_id] = self.backend.state_key()
            self.last_session = job.session_id
            emit(splitter.flush())
            return result, join(said) if fmt is not None else Split("", result.text)

    def _run_prompt(
        self, job: Job[Reply], sampling: Sampling, turn: CompletePrompt, pieces: Pieces | CallStream | None
    ) -> tuple[SlotResult, Split]:
        """Worker thread: a raw prompt (tokens as given), run on the slot; the text is all answer."""
        with structlog.contextvars.bound_contextvars(session_id=job.session_id, request_id=job.id):

            def on_piece(piece: str) -> None:
                if pieces is not None:
                    pieces.feed([piece])

            req = SlotRequest(
                prompt=list(turn.prompt),
                sampling=sampling,
                cancel=job.is_cancelled,
                on_piece=on_piece,
                on_start=pieces.started if pieces is not None else None,
                on_prefill=(lambda done, total: pieces.prefilled(done, total)) if pieces is not None else None,
                request_id=job.id,
                session_id=job.session_id,
                grammar=turn.constraints.grammar,
                speculative=speculation_flag(sampling.speculative),
            )
            result = self.backend.run(req)
            self.last_key[job.session_id] = self.backend.state_key()
            self.last_session = job.session_id
            return result, Split("", result.text)

    def _prefilled(self, job: Job[Reply], pieces: Pieces | CallStream | None, done: int, total: int) -> None:
        """Worker thread: the prefill's progress, for the engine's activity and a stream that reports it."""
        self.activity.prefill(job.id, done, total)
        if pieces is not None:
            pieces.prefilled(done, total)

    @staticmethod
    def _reply(job: Job[Reply], r: SlotResult, revision: int, done: Finished | None = None) -> Reply:
        now = time.perf_counter()
        started = job.started or job.submitted
        if job.pauses:  # one request in several runs: cached as its first run found, prefilled by all of them
            first = job.pauses[0]
            r = dataclasses.replace(
                r,
                cached_tokens=first.cached,
                prefilled_tokens=r.prefilled_tokens + sum(p.prefilled for p in job.pauses),
                cache_source=first.source,
                t_prefill=r.t_prefill + sum(p.t_prefill for p in job.pauses),
                t_decode=r.t_decode + sum(p.t_decode for p in job.pauses),
            )
        return Reply(
            session_id=job.session_id,
            request_id=job.id,
            text=done.text if done is not None else r.text,
            finish_reason=done.finish_reason if done is not None else r.finish_reason,
            usage=Usage(
                prompt_tokens=r.prompt_tokens,
                cached_tokens=r.cached_tokens,
                prefilled_tokens=r.prefilled_tokens,
                generated_tokens=r.generated_tokens,
                dropped_messages=r.dropped_messages,
                draft_n=r.draft_n,
                draft_n_accepted=r.draft_n_accepted,
                aborted_tokens=job.aborted_tokens,
            ),
            cache_source=r.cache_source,
            timings=Timings(
                queued=started - job.submitted,
                cache=r.t_cache,
                prefill=r.t_prefill,
                decode=r.t_decode,
                first_token=r.t_first_token,
                total=now - job.submitted,
                paused=job.paused_s,
                aborted=job.aborted_s,
            ),
            revision=revision,
            parsed=done.parsed if done is not None else None,
            tool_calls=done.tool_calls if done is not None else (),
            reasoning=done.reasoning if done is not None else "",
            stop_sequence=r.stop_sequence,
            tokens=done.tokens if done is not None else (),
            probs=r.probs,
        )
