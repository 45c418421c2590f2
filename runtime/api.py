"""The Runtime: `await rt.chat(session_id, msg)` from any number of tasks, one llama.cpp slot underneath."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, Unpack

import anyio
import anyio.to_thread
import msgspec

from caches.disk.tier import DiskTierStats
from runtime.backend.protocol import Embeddings, EngineInfo, RenderOptions, SlotBackend, SlotFile, SlotFiles, SlotStats
from runtime.config import LoopOptions, RuntimeConfig, reasoning_options
from runtime.errors import ContextOverflow, InvalidConfig, InvalidRequest, RuntimeClosed, TurnstileError
from runtime.llama import hub
from runtime.log import get_logger
from runtime.loop import turn_kinds as tk
from runtime.loop import validate as v
from runtime.loop.engine_view import EngineView, build_view
from runtime.loop.options import (
    CheckedOptions,
    SamplingOptions,
    ToolChoiceArg,
    ToolsArg,
    TurnOptions,
    check_turn_options,
)
from runtime.loop.replay import MAX_TOKENS, Replay
from runtime.loop.replay_disk import DiskRecords
from runtime.loop.scheduler import Job, Scheduler, SchedulerStats
from runtime.loop.session_ops import SessionOps
from runtime.loop.slot_thread import SlotThread
from runtime.loop.stream import Piece, Pieces, follow
from runtime.loop.turn_kinds import Turn
from runtime.loop.turns import TurnRunner, predicted_cost
from runtime.model_info import ModelInfo, model_info
from runtime.reasoning.formats import thinking_off_prefill
from runtime.reply import Progress, Reply, Started
from sessions import DiskStore, MemoryStore
from sessions.store import SessionStore

log = get_logger(__name__)
T = TypeVar("T")

_AFFINITY = {"ram": 1, "disk": 0, "none": 0}


class RuntimeStats(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of the scheduler, the slot and its caches, and the store's session count: all read from
    memory (no I/O, no wait for the worker or a disk write), so the event loop may take them at any time."""

    scheduler: SchedulerStats
    slot: SlotStats
    disk: DiskTierStats | None
    sessions: int

    @property
    def storage(self) -> dict[str, TierBytes]:
        """Per tier ("ram", and "disk" with a disk tier): what whole copies of the held states would take
        (`logical`) and what the tier holds (`stored`: each shared block once, `shared_blocks`)."""
        out = {"ram": TierBytes(logical=self.slot.ram_bytes, stored=self.slot.ram_held_bytes)}
        if self.disk is not None:
            out["disk"] = TierBytes(logical=self.disk.logical_bytes, stored=self.disk.stored_bytes)
        return out


class TierBytes(msgspec.Struct, frozen=True, kw_only=True):
    """A cache tier's bytes: `logical` (whole copies of its states), `stored` (what it holds)."""

    logical: int
    stored: int


def _open_store(session_store: SessionStore | str | None, data_dir: Path | None) -> SessionStore:
    """Worker thread: the given store, a Redis store for a URL, a DiskStore in data_dir, or a MemoryStore."""
    if isinstance(session_store, str):
        from sessions.redis import RedisStore  # the `cluster` extra, imported only when asked for

        return RedisStore.from_url(session_store)
    if session_store is not None:
        return session_store
    if data_dir is not None:
        return DiskStore(data_dir / "sessions")
    return MemoryStore()


class Runtime(SessionOps):
    """Many conversations, one model. Open with `async with Runtime.open(...) as rt:`.

    Every turn method (`chat`, `stream`, `regenerate`, `edit`, `complete`, `complete_stream`) takes the same
    keywords, `TurnOptions` (sampling overrides, `response_format` / `grammar` / `tools` + `tool_choice`,
    `timeout`), all checked before anything is queued.
    """

    def __init__(
        self,
        backend: SlotBackend,
        store: SessionStore,
        config: RuntimeConfig | None = None,
        slot_thread: SlotThread | None = None,
    ) -> None:
        cfg = config if config is not None else RuntimeConfig()
        self.config = cfg
        self.backend = backend
        self.store = store
        sch = cfg.scheduler
        self.scheduler = Scheduler(
            policy=sch.policy,
            max_queued=sch.max_queued,
            affinity=self._affinity,
            idle=self._settle,
            prefill_quantum_ms=sch.prefill_quantum_ms,
            decode_quantum_ms=sch.decode_quantum_ms,
            prefill_abort_ms=sch.prefill_abort_ms,
            defer_replies=sch.defer_replies,
        )
        # the one thread that touches llama.cpp (one OpenMP team: see runtime/loop/slot_thread.py)
        self._slot_thread = slot_thread if slot_thread is not None else SlotThread()
        self._turns = TurnRunner(backend, store, self._store, self._in_slot_thread, cfg.context, cfg.reasoning)
        self._turns.replay = self._replay()
        if not cfg.cache.rules.replay:  # llama-server's rules: the prompt is the template's render, as there
            self._turns.replay = None
        self._closed = False
        self._anonymous = itertools.count(1)  # queue ids of stateless requests (never stored)

    # --- lifetime ------------------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        model: str | os.PathLike[str] | None = None,
        config: RuntimeConfig | None = None,
        *,
        session_store: SessionStore | str | None = None,
        hf: str | None = None,
        hf_file: str | None = None,
        **settings: Any,
    ) -> AsyncIterator[Runtime]:
        """Load the model (off the event loop), start the worker; close everything on exit.

        `config` (default: `RuntimeConfig()`) with `settings` applied by name (`config.replace`: `n_ctx=4096`,
        `data_dir=...`, `cache_rules="llama-server"`, `shared_blocks=64`, `policy="affinity"`, `reasoning="off"`,
        ...; each is documented on its field in `runtime.config`); `model` replaces the config's. Every setting
        is checked (`InvalidConfig`, also for an unknown name) before anything is loaded or created.
        session_store: where sessions live instead (the Runtime closes it on exit): a `SessionStore`, or a
        Redis URL (`redis://`, `rediss://`, `unix://`) for a `RedisStore` shared by several runtimes; data_dir
        then holds only the disk tier.
        hf "ORG/REPO[:QUANT]" (instead of model) and hf_file: a GGUF downloaded from the Hugging Face hub into
        its cache, chosen as llama-server's `-hf`/`--hf-file` choose it (`runtime.llama.hub`; the `hub` extra).
        The hardware settings (llama-server's flags, docs/hardware.md): n_gpu_layers (-ngl; -1 all),
        type_k/type_v (-ctk/-ctv: f16, bf16, q8_0, q4_0, ...), flash_attn (-fa: True, False or "auto"),
        use_mmap, use_mlock.
        """
        source = None
        if hf is not None or hf_file is not None:
            if model is not None or "model" in settings:
                raise InvalidConfig("model and hf are two sources for the model: give one")
            if hf is None:
                raise InvalidConfig("hf_file needs hf (the repository)")
            source = hub.parse_repo(hf, hf_file)
        config = (config if config is not None else RuntimeConfig()).replace(**settings)
        if model is not None:
            config = config.replace(model=model)
        if session_store is not None and not isinstance(session_store, str | SessionStore):
            raise InvalidConfig(f"session_store must be a SessionStore, a Redis URL or None, not {session_store!r}")
        if source is not None:
            config = config.replace(model=await anyio.to_thread.run_sync(hub.download, source))
        from runtime.backend.llama import LlamaBackend  # loads llama.cpp: only when a model is opened

        thread = SlotThread()  # built where it will run: llama.cpp's threads belong to the calling thread
        try:
            backend = await thread.run(LlamaBackend.build, config)
        except BaseException:
            thread.shutdown()
            raise
        try:
            store = await anyio.to_thread.run_sync(_open_store, session_store, config.data_dir)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await thread.run(backend.close)
            thread.shutdown()
            raise
        log.info(
            "runtime.open",
            model=str(backend.engine.path),
            data_dir=str(config.data_dir) if config.data_dir else None,
            n_ctx=backend.n_ctx,
            ram_limit=config.cache.ram_limit,
            policy=config.scheduler.policy,
        )
        async with cls.serve(backend, store, config, slot_thread=thread) as rt:
            yield rt

    @classmethod
    @asynccontextmanager
    async def serve(
        cls,
        backend: SlotBackend,
        store: SessionStore,
        config: RuntimeConfig | None = None,
        slot_thread: SlotThread | None = None,
        **loop: Unpack[LoopOptions],
    ) -> AsyncIterator[Runtime]:
        """Run a runtime over a backend and a store that are already built (`runtime.testing.ScriptedBackend`
        for tests without a model); closes both on exit. `policy`, `max_queued`, `context`, `reasoning`: as in
        `open` (they replace the config's). `slot_thread`: the thread the backend was built on (default: a new
        one); the Runtime shuts it down when it closes."""
        rt = cls(backend, store, (config if config is not None else RuntimeConfig()).replace(**loop), slot_thread)
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.scheduler.run)
            try:
                yield rt
            finally:
                with anyio.CancelScope(shield=True):
                    await rt.aclose()

    async def aclose(self) -> None:
        """Finish the running turn, fail queued ones with RuntimeClosed, flush the disk tier, free the model."""
        if self._closed:
            return
        self._closed = True
        await self.scheduler.close()
        await self.scheduler.wait_stopped()
        try:
            await self._in_slot_thread(self._close_sync)
        finally:
            self._slot_thread.shutdown()
        log.info("runtime.closed")

    def _close_sync(self) -> None:
        try:
            self.backend.close()
        finally:
            self.store.close()

    async def _in_slot_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._slot_thread.run(fn, *args)

    async def _settle(self) -> None:
        """The worker is idle: the slot finishes what could wait until the last reply was out."""
        await self._in_slot_thread(self.backend.settle)

    def _affinity(self, session_id: str) -> int:
        """2: the slot holds this session's state; 1: the RAM cache does; 0: neither (read between jobs)."""
        key = self._turns.last_key.get(session_id)
        if key is None:
            return 0
        if session_id == self._turns.last_session:
            return 2
        return _AFFINITY[self.backend.locate(key)]

    # --- turns ---------------------------------------------------------------------------------------

    async def chat(
        self,
        session_id: str,
        message: str | None = None,
        *,
        tool_results: Mapping[str, Any] | None = None,
        **options: Unpack[TurnOptions],
    ) -> Reply:
        """Send a user message (or the results of the last reply's tool calls) and return the reply.

        The session is created by its first committed turn. `response_format` (a msgspec Struct, dataclass or
        TypedDict type, a JSON-schema dict, or "json") constrains the reply to JSON (`reply.parsed`); `grammar`
        to a GBNF grammar; `tools` (OpenAI tool dicts or functions) lets the model call them
        (`reply.tool_calls`, answered with `chat(sid, tool_results={call_id: value})`).
        """
        opts = self._options(options)
        return await self._run_turn(session_id, self._chat_turn(message, tool_results, opts), opts)

    async def run(
        self,
        session_id: str,
        message: str,
        *,
        tools: ToolsArg,
        tool_choice: ToolChoiceArg = "auto",
        max_steps: int = 8,
        timeout: float | None = None,
        **sampling: Unpack[SamplingOptions],
    ) -> Reply:
        """The agent loop: chat, call the Python functions the model asks for, feed the results back, until
        the model answers; the final Reply carries the `steps`. `MaxStepsExceeded` after `max_steps` calls."""
        from runtime.loop.agent import run_agent

        return await run_agent(self, session_id, message, tools, tool_choice, max_steps, timeout, sampling)

    async def regenerate(self, session_id: str, **options: Unpack[TurnOptions]) -> Reply:
        """Replace the last reply with a new one for the same user message (or tool results)."""
        opts = self._options(options)
        turn = tk.Regenerate(overrides=opts.sampling, constraints=opts.constraints)
        return await self._run_turn(session_id, turn, opts)

    async def edit(self, session_id: str, index: int, content: str, **options: Unpack[TurnOptions]) -> Reply:
        """Replace user message `index`, drop what followed, and answer it anew (the same options as
        `regenerate`, constraints included)."""
        opts = self._options(options)
        text, at = v.check_text(content, "content"), v.check_index(index)
        turn = tk.Edit(overrides=opts.sampling, constraints=opts.constraints, index=at, message=text)
        return await self._run_turn(session_id, turn, opts)

    async def stream(
        self,
        session_id: str,
        message: str | None = None,
        *,
        tool_results: Mapping[str, Any] | None = None,
        **options: Unpack[TurnOptions],
    ) -> AsyncIterator[Piece | Reply]:
        """Yield the reply's pieces as they are generated, then the Reply. A thinking model's reasoning comes
        as `runtime.Reasoning` pieces (a `str` subclass), its answer as plain `str`; tags never show. When tools
        are offered, the answer still streams (only text that may become a call is held back) and tool calls
        come as `runtime.ToolCallDelta` pieces; the pieces always add up to the Reply."""
        opts, pieces = self._options(options), Pieces()
        job = self._submit(session_id, self._chat_turn(message, tool_results, opts, pieces), opts.timeout)
        async for item in follow(self.scheduler, job, pieces, opts.timeout):
            if not isinstance(item, Started):  # (only a `progress` stream has them)
                yield item

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        session_id: str | None = None,
        namespace: str = "",
        **options: Unpack[TurnOptions],
    ) -> Reply:
        """A reply to an OpenAI-shaped message list, through the same queue, slot and caches as `chat`.

        Stateless by default (nothing is stored; each call is queued on its own). With `session_id`, calls
        are queued per session like `chat`, and the session's transcript becomes `messages` + the reply.
        `namespace`: the key (tenant name) a stateless call is queued and shared under (`runtime.loop.fair`);
        a session's key is its id's namespace.
        """
        opts = self._options(options)
        job = self._submit_complete(messages, session_id, opts, None, namespace)
        return await self.scheduler.wait(job, opts.timeout)

    def set_replay(self, on: bool) -> None:
        """Replay resent replies as the tokens generated for them (on by default; `runtime.loop.replay`)."""
        self._turns.replay = (self._turns.replay or self._replay()) if on else None

    def _replay(self) -> Replay:
        """The replay records: also on disk (`data_dir/replay`) when the runtime has a data dir."""
        if self.config.data_dir is None:
            return Replay()
        info = model_info(self.backend)
        engine = getattr(self.backend, "engine", None)
        fingerprint = str(getattr(engine, "fingerprint", "")) or f"{info.name}:{info.n_vocab}"
        records = DiskRecords(
            self.config.data_dir / "replay", fingerprint=fingerprint, n_vocab=info.n_vocab, max_tokens=MAX_TOKENS
        )
        return Replay(disk=records)

    def complete_stream(
        self,
        messages: list[dict[str, Any]],
        *,
        session_id: str | None = None,
        namespace: str = "",
        **options: Unpack[TurnOptions],
    ) -> AsyncIterator[Piece | Reply]:
        """`complete`, streamed: the reply's pieces (as `stream`'s), then the Reply."""
        return self._complete_stream(messages, session_id, False, options, namespace)  # type: ignore[return-value]

    def complete_stream_started(
        self,
        messages: list[dict[str, Any]],
        *,
        session_id: str | None = None,
        namespace: str = "",
        prefill_progress: bool = False,
        **options: Unpack[TurnOptions],
    ) -> AsyncIterator[Piece | Started | Reply]:
        """`complete_stream` with a `Started` first, as soon as the slot starts the turn (before its prefill):
        what a server needs to answer before a long prefill ends; with `prefill_progress`, `Progress` reports
        of the prefill after it (llama-server's return_progress)."""
        return self._complete_stream(messages, session_id, True, options, namespace, prefill_progress)

    async def _complete_stream(
        self,
        messages: list[dict[str, Any]],
        session_id: str | None,
        progress: bool,
        options: TurnOptions,
        namespace: str = "",
        prefill: bool = False,
    ) -> AsyncIterator[Piece | Started | Reply]:
        opts, pieces = self._options(options), Pieces(progress=progress, prefill=prefill)
        job = self._submit_complete(messages, session_id, opts, pieces, namespace)
        async for item in follow(self.scheduler, job, pieces, opts.timeout):
            yield item

    async def complete_prompt(self, prompt: Sequence[int], **options: Unpack[TurnOptions]) -> Reply:
        """A continuation of a raw prompt (token ids, no chat template), stateless, through the same queue,
        slot and caches as every turn (llama-server's /completion). ContextOverflow, before anything is
        queued, when the prompt does not fit the context."""
        opts = self._options(options)
        job = self._submit_prompt(prompt, opts, None)
        return await self.scheduler.wait(job, opts.timeout)

    async def complete_prompt_stream(
        self, prompt: Sequence[int], *, progress: bool = False, **options: Unpack[TurnOptions]
    ) -> AsyncIterator[Piece | Progress | Reply]:
        """`complete_prompt`, streamed: the pieces, then the Reply; with `progress`, the prefill's `Progress`
        reports first (llama-server's return_progress: the cached tokens, then one per n_batch chunk)."""
        opts, pieces = self._options(options), Pieces(prefill=progress)
        job = self._submit_prompt(prompt, opts, pieces)
        async for item in follow(self.scheduler, job, pieces, opts.timeout):
            if isinstance(item, Progress) or not isinstance(item, Started):
                yield item

    def model_info(self) -> ModelInfo:
        """What the model is: file, context size, vocabulary, chat template, BOS/EOS text (llama-server's /props)."""
        return model_info(self.backend)

    def _submit_prompt(self, prompt: Sequence[int], opts: CheckedOptions, pieces: Pieces | None) -> Job[Reply]:
        if not isinstance(prompt, Sequence) or isinstance(prompt, str | bytes) or not prompt:
            raise InvalidRequest("prompt must be a non-empty list of token ids")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise InvalidRequest("prompt must be a list of token ids (ints >= 0)")
        tokens = tuple(prompt)
        for t in set(tokens):
            self.backend.token_piece(t)  # an id outside the vocabulary raises InvalidRequest
        if len(tokens) >= self.backend.n_ctx:
            raise ContextOverflow(len(tokens), self.backend.n_ctx)
        sid = f"@stateless:{next(self._anonymous)}"
        turn = tk.CompletePrompt(overrides=opts.sampling, pieces=pieces, constraints=opts.constraints, prompt=tokens)
        return self._submit(sid, turn, opts.timeout)

    def _options(self, options: TurnOptions) -> CheckedOptions:
        """The turn's options checked (typed errors, before anything is queued)."""
        return check_turn_options(options, self.backend)

    @staticmethod
    def _chat_turn(
        message: object, tool_results: Mapping[str, Any] | None, opts: CheckedOptions, pieces: Pieces | None = None
    ) -> Turn:
        """A chat turn: a message or the results of the last reply's tool calls, checked."""
        if (message is None) == (tool_results is None):
            raise InvalidRequest("give either a message or tool_results")
        if tool_results is not None:
            results = v.check_tool_results(tool_results)
            return tk.ToolResults(overrides=opts.sampling, pieces=pieces, constraints=opts.constraints, results=results)
        return tk.Chat(
            overrides=opts.sampling, pieces=pieces, constraints=opts.constraints, message=v.check_text(message)
        )

    def _submit_complete(
        self, messages: object, session_id: str | None, opts: CheckedOptions, pieces: Pieces | None, namespace: str
    ) -> Job[Reply]:
        if session_id is None:  # queued under the key's namespace (`runtime.loop.fair.namespace_of`)
            space = f"{v.check_namespace(namespace)}@" if namespace else ""
            sid = f"{space}@stateless:{next(self._anonymous)}"
        else:
            sid = v.check_session_id(session_id)
        try:
            conversation = v.check_conversation(messages, sid)
        except InvalidRequest:
            self._check_fits(messages)  # a history too long for the context says so first, as llama-server
            raise
        turn = tk.Complete(
            overrides=opts.sampling,
            pieces=pieces,
            constraints=opts.constraints,
            conversation=conversation,
            stored=session_id is not None,
        )
        return self._submit(sid, turn, opts.timeout)

    def _check_fits(self, messages: object) -> None:
        """ContextOverflow when `messages`, rendered by the chat template as they are, do not fit the context.

        For a message list the session model refuses (a system message after the first): llama-server renders
        any roles and answers a history longer than its context with the context-size error, so a client that
        sends one (llama.cpp's suite sends a 100-turn one) learns the same here. Called only on that refusal
        path; a render or tokenize failure leaves the refusal as it was."""
        if not isinstance(messages, list):
            return
        try:
            text = self.backend.apply_template(messages, add_generation_prompt=True)
            n = len(self.backend.tokenize(text, add_special=True, parse_special=True))
        except (TurnstileError, TypeError, ValueError):
            return
        if n >= self.backend.n_ctx:
            raise ContextOverflow(n, self.backend.n_ctx)

    async def _run_turn(self, session_id: str, turn: Turn, opts: CheckedOptions) -> Reply:
        return await self.scheduler.wait(self._submit(session_id, turn, opts.timeout), opts.timeout)

    def _submit(self, session_id: str, turn: Turn, timeout: float | None) -> Job[Reply]:
        """Queue a checked turn (its session id checked here; nothing is created or queued if a check fails)."""
        if turn.commit:  # a completion that stores nothing has an id made here
            v.check_session_id(session_id)
        if self._closed:
            raise RuntimeClosed("the runtime is closed")

        async def execute(job: Job[Reply]) -> Reply:
            return await self._turns.run(job, turn)

        return self.scheduler.submit(session_id, execute, kind=turn.kind, cost=predicted_cost(turn))

    async def apply_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt the model's chat template gives these OpenAI-style messages (and tools: dicts or
        functions, and template variables), exactly as llama-server's `/apply-template` renders it: with the
        runtime's reasoning mode applied (its template switch; under "off", llama-server's closed block).
        The given `chat_template_kwargs` win over the mode's switch."""
        from runtime.tools import as_tools

        specs = [t.openai() for t in as_tools(tools)] if tools else None
        given = dict(chat_template_kwargs) if chat_template_kwargs is not None else {}
        backend, controls = self.backend, self.config.reasoning

        def render() -> str:
            fmt = backend.reasoning_format()
            variables = {**controls.template_variables(fmt), **given}
            options = RenderOptions(tools=specs, template_kwargs=variables or None)
            text = backend.apply_template(messages, options, add_generation_prompt)
            return thinking_off_prefill(text, fmt) if add_generation_prompt and controls.mode == "off" else text

        return await anyio.to_thread.run_sync(render)

    async def count_tokens(self, messages: list[dict[str, Any]], **options: Unpack[TurnOptions]) -> int:
        """The token count of the prompt `complete(messages, **options)` would render (tools, reasoning controls
        and all; the whole conversation, no context window), without queueing anything. The render is for no
        session and tokenizing reads only the vocabulary, so it runs in a worker thread beside the slot."""
        opts = self._options(options)
        conversation = v.check_conversation(messages, "count")
        count = self._turns.count
        return await anyio.to_thread.run_sync(lambda: count(conversation, opts.sampling, opts.constraints.tools))

    async def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """The model's tokens for a text (a worker thread: tokenizing reads only the vocabulary)."""
        tokenize = self.backend.tokenize
        return await anyio.to_thread.run_sync(
            lambda: tokenize(text, add_special=add_special, parse_special=parse_special)
        )

    async def token_pieces(self, tokens: Sequence[int]) -> list[bytes]:
        """Each token's bytes, special tokens spelled out; `InvalidRequest` for an id outside the vocabulary."""
        piece = self.backend.token_piece
        return await anyio.to_thread.run_sync(lambda: [piece(t) for t in tokens])

    # --- embeddings (llama-server's --embedding) -------------------------------------------------------

    def _embeddings(self) -> Embeddings:
        if not isinstance(self.backend, Embeddings):
            raise InvalidRequest(f"{type(self.backend).__name__} cannot embed")
        return self.backend

    async def embed(self, inputs: Sequence[Sequence[int]], *, normalize: int = 2) -> list[list[list[float]]]:
        """Embeddings of token lists from a second context on the same weights (made on first use), in the
        worker thread between requests: the chat slot's state is not touched. Per input: [one vector] when the
        pooling pools (normalized: llama.cpp's embd_normalize), else one vector per token."""
        backend = self._embeddings()
        return await self._in_slot_thread(backend.embed, [list(t) for t in inputs], normalize)

    async def rerank(self, inputs: Sequence[Sequence[int]]) -> list[float]:
        """Scores of token lists (query and document each, in the model's rerank layout) from the embedding
        context under `rank` pooling; between requests, the chat slot untouched."""
        backend = self._embeddings()
        return await self._in_slot_thread(backend.rerank, [list(t) for t in inputs])

    async def embedding_pooling(self) -> str:
        """The embedding context's pooling: none, mean, cls, last or rank."""
        return await self._in_slot_thread(self._embeddings().embedding_pooling)

    # --- llama-server's slot actions ---------------------------------------------------------------------

    def _slot_files(self) -> SlotFiles:
        if not isinstance(self.backend, SlotFiles):
            raise InvalidRequest(f"{type(self.backend).__name__} keeps no slot state to save or restore")
        return self.backend

    async def save_slot(self, path: Path) -> SlotFile:
        """Write what the slot holds now (tokens, state, checkpoints) to `path` (llama-server's slot save), in
        the worker thread between requests."""
        return await self._in_slot_thread(self._slot_files().save_slot, path)

    async def restore_slot(self, path: Path) -> SlotFile:
        """Load a slot file into the slot (what it held is kept in the cache first); the next request whose
        prompt starts with the file's tokens reuses them."""
        files = self._slot_files()
        done = await self._in_slot_thread(files.restore_slot, path)
        self._turns.last_session = None  # the slot holds no session's state now
        return done

    async def erase_slot(self) -> int:
        """Forget what the slot holds (cached states stay); the number of tokens it held."""
        files = self._slot_files()
        n = await self._in_slot_thread(files.erase_slot)
        self._turns.last_session = None
        return n

    @property
    def model_name(self) -> str:
        """What the Runtime runs (the model file's name), for logs and /v1/models."""
        return self.backend.name

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    # --- numbers -------------------------------------------------------------------------------------

    def engine_view(self) -> EngineView:
        """What the engine is doing now (the queue, the request on the slot and its phase, the tiers, where each
        session's state is), read from memory on the event loop; for watchers such as the web page."""
        return build_view(
            self.scheduler,
            self._turns.activity,
            self.backend.stats(),
            self.backend.disk_stats(),
            ram_limit=self.config.cache.ram_limit,
            shared_blocks=self.config.cache.shared_blocks,
            last_keys=self._turns.last_key,
            last_session=self._turns.last_session,
            locate=self.backend.locate,
        )

    async def wait_submitted(self) -> None:
        """Wait until the next request (a turn or a session operation) is queued."""
        await self.scheduler.wait_submitted()

    def stats(self) -> RuntimeStats:
        return RuntimeStats(
            scheduler=self.scheduler.stats(),
            slot=self.backend.stats(),
            disk=self.backend.disk_stats(),
            sessions=self.store.count(),
        )

    def engine_info(self) -> EngineInfo:
        """The hardware settings the model runs with: GPU layers offloaded (0 on a CPU build), KV cache types,
        flash attention, mmap/mlock, threads (what `/v1/models` reports in its `meta`, beside `model_info`)."""
        return self.backend.engine_info()

    def set_key_weights(self, weight: Callable[[str], int]) -> None:
        """The API keys' weights by session namespace (`weight(namespace)`, 1 to 1000): the scheduler's fair share
        across keys and the RAM and disk tiers' shares (`caches.shares`) both follow them."""
        self.scheduler.keys.set_weights(weight)
        self.backend.set_key_weights(weight)


__all__ = ["Reply", "Runtime", "RuntimeStats", "TierBytes", "TurnstileError", "reasoning_options"]
