"""The pytest plugin's slot backend: replays recorded replies, records new ones, or runs the model.

`CassetteBackend` sits where the Runtime meets the slot (rendered prompt in, raw reply out), so every API on
top (chat, stream, run, complete, tools, reasoning, structured output) records and replays alike. The model
(a `LlamaBackend`, built by the `load` callable) is loaded only when a request needs it: a live test, a test
that records, a miss in `new_episodes`. Until then prompts are rendered with the chat-template settings kept
in the current test's cassette (`runtime.llama.chat_template.ChatTemplate` is pure Jinja) and tokenized one
token per character, which only replay sees; llama_cpp is never imported on that path.

`context` is the test that runs now (pytest runs one test at a time per process; the host sets it). Worker
thread and event loop may both ask for the side that renders; loading is guarded by a lock.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from caches.disk.stats import DiskTierStats
from caches.tiered import Location
from runtime.backend.protocol import (
    WHOLE,
    EngineInfo,
    GrammarSpec,
    RenderedChat,
    RenderOptions,
    SlotBackend,
    SlotRequest,
    SlotResult,
    SlotStats,
)
from runtime.errors import RecordingNotFound
from runtime.llama.chat_template import ChatTemplate
from runtime.llama.host import fingerprint_file
from runtime.reasoning import ReasoningFormat, detect, with_template
from runtime.testing.chars import char_piece, char_tokens, computed_nothing
from runtime.testing.pytest_plugin.cassette import Cassette, request_key
from runtime.tools import ToolFormat
from sessions import Sampling
from sessions.sampler_settings import NAMES as SAMPLER_NAMES

__all__ = ["CassetteBackend", "Counters", "TestContext"]

Mode = str  # "live" (no cassette) | "replay" | "record_new" (hits replay, misses record) | "record_all"


@dataclass
class TestContext:
    """The test that runs now: its id, its session-id namespace, its cassette and effective record mode."""

    nodeid: str
    prefix: str
    cassette: Cassette | None
    mode: Mode

    def needs_model(self) -> bool:
        return self.mode in ("live", "record_all")


@dataclass
class Counters:
    """What the plugin counts in this process (the terminal summary line)."""

    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefilled_tokens: int = 0
    model_seconds: float = 0.0
    hits: int = 0
    misses: int = 0
    recorded: int = 0
    loads: int = 0

    def add(self, other: Mapping[str, Any]) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + other.get(f.name, 0))


_EMPTY = SlotStats()
_Args = tuple[Sequence[Mapping[str, Any]], str | None]  # prepare's messages and session id
_PIECES = re.compile(r"\s*\S+|\s+$")


class _Replay:
    """A model's chat template rebuilt from a cassette: renders, detects formats; no vocabulary."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        s = dict(settings)
        self.generation = str(s.pop("generation_prompt", ""))
        self.template = ChatTemplate(
            s.get("template"),
            eos=str(s.get("eos", "")),
            bos=str(s.get("bos", "")),
            tokenize=char_tokens,
            model=str(s.get("model", "")),
            tool_use=s.get("tool_use"),
            override=s.get("override"),
            add_bos=bool(s.get("add_bos")),
            add_eos=bool(s.get("add_eos")),
        )
        fmt = detect(self.template.source)
        template = self.template

        def render(messages: list[dict[str, Any]]) -> str:
            kwargs = {"enable_thinking": True} if fmt is not None and fmt.switch else None
            return template.render_text(messages, add_generation_prompt=False, template_kwargs=kwargs)

        self.reasoning = with_template(fmt, render) if fmt is not None else None


class CassetteBackend:
    """A `SlotBackend` that replays, records or runs the model per the current test (module docstring)."""

    def __init__(self, model: Path, n_ctx: int, load: Callable[[], Any], counters: Counters) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.name = model.name
        self.counters = counters
        self.context: TestContext | None = None
        self.inner: Any = None  # the LlamaBackend, once loaded
        self._load = load
        self._lock = threading.Lock()
        self._fingerprint: str | None = None
        self._replays: dict[str, _Replay] = {}
        self._last: tuple[_Args, RenderOptions, str, bool] | None = None  # prepare's args, text, real

    # --- which side renders --------------------------------------------------------------------------

    def loaded(self) -> SlotBackend:
        """The model's backend, loaded now if it is not yet (blocking: a worker thread, or the host's preload)."""
        with self._lock:
            if self.inner is None:
                self.inner = self._load()
                self.counters.loads += 1
                self._fingerprint = str(self.inner.engine.fingerprint)
            inner: SlotBackend = self.inner
            return inner

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            if self.model.is_file():
                self._fingerprint = fingerprint_file(self.model)
            else:  # replay without the model file: the fingerprint its recordings were made with
                cassette = self.context.cassette if self.context is not None else None
                return (cassette.model_for(self.name) if cassette is not None else None) or "unknown"
        return self._fingerprint

    def _side(self) -> SlotBackend | _Replay:
        ctx = self.context
        if self.inner is not None or ctx is None or ctx.needs_model() or ctx.cassette is None:
            return self.loaded()
        fp = self.fingerprint()
        settings = ctx.cassette.models.get(fp)
        if settings is None:
            if ctx.mode == "record_new" and self.model.is_file():
                return self.loaded()
            raise RecordingNotFound(ctx.nodeid, "", f"{ctx.cassette.path} has no recordings of {self.name} ({fp})")
        replay = self._replays.get(fp)
        if replay is None:
            replay = self._replays[fp] = _Replay(settings)
        return replay

    # --- SlotBackend ---------------------------------------------------------------------------------

    def prepare(
        self, messages: Sequence[Mapping[str, Any]], session_id: str | None = None, options: RenderOptions = WHOLE
    ) -> RenderedChat:
        side = self._side()
        if isinstance(side, _Replay):
            rendered = side.template.render([dict(m) for m in messages], **options.kwargs())
        else:
            rendered = side.prepare(messages, session_id, options)
        self._last = ((messages, session_id), options, rendered.text, not isinstance(side, _Replay))
        return rendered

    def run(self, req: SlotRequest) -> SlotResult:
        assert self._last is not None, "prepare comes right before run"
        (args, options, text, real), self._last = self._last, None
        ctx = self.context if self.context is not None else TestContext("", "", None, "live")
        if ctx.cassette is None:
            return self._model_run(req, args, options, real)
        request = _request(req)
        key = request_key(self.fingerprint(), text, request)
        entry = ctx.cassette.entries.get(key) if ctx.mode != "record_all" else None
        if entry is not None:
            self.counters.hits += 1
            return _replayed(entry["reply"], req)
        if ctx.mode == "replay" and req.cancel():  # its caller is gone: nothing to answer, nothing to report
            return _replayed({"text": "", "finish_reason": "cancelled", "prompt_tokens": len(req.prompt)}, req)
        self.counters.misses += 1
        if ctx.mode == "replay":
            session = req.session_id.removeprefix(ctx.prefix)
            raise RecordingNotFound(ctx.nodeid, session, ctx.cassette.nearest(text, request, ctx.nodeid, session))
        result = self._model_run(req, args, options, real)
        if result.finish_reason != "cancelled":
            inner: Any = self.inner
            settings = {**inner.engine.template.settings(), "generation_prompt": inner.generation_prompt()}
            ctx.cassette.add_model(self.fingerprint(), settings)
            session = req.session_id.removeprefix(ctx.prefix)
            reply = {
                "text": result.text,
                "finish_reason": result.finish_reason,
                "prompt_tokens": result.prompt_tokens,  # cached / prefilled depend on the cache: not kept
                "generated_tokens": result.generated_tokens,
            }
            entry = {"test": ctx.nodeid, "session": session, "prompt": text, "request": request, "reply": reply}
            ctx.cassette.record(key, entry)
            self.counters.recorded += 1
        return result

    def _model_run(self, req: SlotRequest, args: _Args, options: RenderOptions, real: bool) -> SlotResult:
        inner = self.loaded()
        if not real:  # rendered from the cassette: the model's own tokens now
            rendered = inner.prepare(*args, options)
            req = dataclasses.replace(req, prompt=rendered.tokens, user_starts=rendered.user_starts)
        start = time.perf_counter()
        result = inner.run(req)
        n = self.counters
        n.model_seconds += time.perf_counter() - start
        if result.finish_reason == "cancelled":  # withdrawn: how far it got depends on timing, not on the suite
            return result
        n.turns += 1
        n.prompt_tokens += result.prompt_tokens
        n.cached_tokens += result.cached_tokens
        n.prefilled_tokens += result.prefilled_tokens
        return result

    def tool_format(self) -> ToolFormat:
        side = self._side()
        return side.template.tool_format() if isinstance(side, _Replay) else side.tool_format()

    def generation_prompt(self) -> str:
        side = self._side()
        return side.generation if isinstance(side, _Replay) else side.generation_prompt()

    def reasoning_format(self) -> ReasoningFormat | None:
        side = self._side()
        return side.reasoning if isinstance(side, _Replay) else side.reasoning_format()

    def apply_template(
        self, messages: Sequence[Mapping[str, Any]], options: RenderOptions = WHOLE, add_generation_prompt: bool = True
    ) -> str:
        side = self._side()
        if isinstance(side, _Replay):
            listed, gen, kw = [dict(m) for m in messages], add_generation_prompt, options.template_kwargs
            return side.template.render_text(listed, add_generation_prompt=gen, tools=options.tools, template_kwargs=kw)
        return side.apply_template(messages, options, add_generation_prompt)

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        side = self._side()
        if isinstance(side, _Replay):
            return char_tokens(text)
        return side.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_piece(self, token: int) -> bytes:
        side = self._side()
        return char_piece(token) if isinstance(side, _Replay) else side.token_piece(token)

    def check_grammar(self, spec: GrammarSpec) -> None:
        side = self._side()
        if not isinstance(side, _Replay):  # replay: the recorded request's grammar parsed when it was recorded
            side.check_grammar(spec)

    def settle(self) -> None:
        if self.inner is not None:
            self.inner.settle()

    def set_key_weights(self, weight: Callable[[str], int]) -> None:
        if self.inner is not None:
            self.inner.set_key_weights(weight)

    def state_key(self) -> int:
        return self.inner.state_key() if self.inner is not None else 0

    def locate(self, key: int) -> Location:
        where: Location = self.inner.locate(key) if self.inner is not None else "none"
        return where

    def stats(self) -> SlotStats:
        return self.inner.stats() if self.inner is not None else _EMPTY

    def disk_stats(self) -> DiskTierStats | None:
        return self.inner.disk_stats() if self.inner is not None else None

    def engine_info(self) -> EngineInfo:
        return self.inner.engine_info() if self.inner is not None else EngineInfo(model=self.name, n_ctx=self.n_ctx)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def _request(req: SlotRequest) -> dict[str, Any]:
    """The settings of a request that change its reply (token ids left out: they depend on the tokenizer)."""
    grammar = None
    if req.grammar is not None:
        g = req.grammar
        grammar = {"gbnf": g.gbnf, "lazy": g.lazy, "triggers": list(g.trigger_patterns), "prefill": g.prefill}
    sampling: dict[str, Any] = msgspec.to_builtins(req.sampling)
    del sampling["speculative"]  # the session's or turn's choice: recorded as the request's `speculative`
    for name in SAMPLER_NAMES:  # llama.cpp's other samplers count only when set: older cassettes keep their keys
        if sampling[name] == _SAMPLER_DEFAULTS[name]:
            del sampling[name]
    budget = msgspec.to_builtins(req.budget) if req.budget is not None else None
    return {"sampling": sampling, "grammar": grammar, "budget": budget, "speculative": req.speculative}


def _replayed(reply: Mapping[str, Any], req: SlotRequest) -> SlotResult:
    """A recorded reply as a slot result, streamed a word at a time; a cancelled caller stops it. Nothing is
    computed, so its usage shows the whole prompt as cached and nothing prefilled."""
    text, finish = "", str(reply.get("finish_reason", "stop"))
    for piece in _PIECES.findall(str(reply.get("text", ""))):
        if req.cancel():
            finish = "cancelled"
            break
        text += piece
        if req.on_piece is not None:
            req.on_piece(piece)
    prompt, generated = int(reply.get("prompt_tokens", 0)), [0] * int(reply.get("generated_tokens", 0))
    return computed_nothing(
        text,
        finish,  # type: ignore[arg-type]
        tokens=generated,
        prompt_tokens=prompt,
        cached_tokens=prompt,  # nothing was computed: the whole prompt counts as cached
        cache_source="none",
    )


_SAMPLER_DEFAULTS: dict[str, Any] = msgspec.to_builtins(Sampling())
