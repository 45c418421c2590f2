"""The turn options, defined once (`runtime.loop.options.TurnOptions`) and taken by every turn method; the
Runtime's config, checked once (`RuntimeConfig`). Scripted backend: no model."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
import pytest

from runtime import InvalidConfig, Reply, Runtime
from runtime.backend.protocol import SlotRequest, SlotResult
from runtime.cache_rules import LLAMA_SERVER, CacheRuleSet
from runtime.config import LoopOptions, RuntimeConfig
from runtime.loop.options import CONSTRAINT_KEYS, SamplingOptions, TurnOptions
from runtime.testing import ScriptedBackend
from sessions import InvalidSampling, MemoryStore, Sampling

TURN_METHODS = ("chat", "stream", "regenerate", "edit", "complete", "complete_stream")


class Verdict(msgspec.Struct):
    answer: str
    confidence: float


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Recording(ScriptedBackend):
    """A scripted backend that keeps every request it ran (the grammar, the sampling, the stop strings)."""

    def __init__(self, reply: Callable[[Sequence[dict[str, Any]]], str]) -> None:
        super().__init__(reply)
        self.requests: list[SlotRequest] = []

    def run(self, req: SlotRequest) -> SlotResult:
        self.requests.append(req)
        return super().run(req)


async def _drain(items: AsyncIterator[str | Reply]) -> Reply:
    got = [item async for item in items]
    assert isinstance(got[-1], Reply)
    return got[-1]


def test_sampling_options_are_the_sampling_fields() -> None:
    assert set(SamplingOptions.__annotations__) == set(Sampling.__struct_fields__)
    assert TurnOptions.__optional_keys__ == set(Sampling.__struct_fields__) | CONSTRAINT_KEYS | {"timeout"}
    assert TurnOptions.__required_keys__ == frozenset()
    assert {"response_format", "grammar", "tools", "tool_choice", "parallel_tool_calls"} == CONSTRAINT_KEYS


@pytest.mark.parametrize("method", TURN_METHODS)
def test_every_turn_method_takes_the_turn_options(method: str) -> None:
    params = inspect.signature(getattr(Runtime, method)).parameters
    variadic = [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert [(p.name, p.annotation) for p in variadic] == [("options", "Unpack[TurnOptions]")]
    assert not set(params) & TurnOptions.__optional_keys__  # no option is also a parameter of its own


TYPO_CALLS: list[tuple[str, Callable[[Runtime], Awaitable[Any]]]] = [
    ("chat", lambda rt: rt.chat("a", "hi", temprature=0.5)),  # type: ignore[call-arg]
    ("stream", lambda rt: _drain(rt.stream("a", "hi", temprature=0.5))),  # type: ignore[call-arg]
    ("regenerate", lambda rt: rt.regenerate("a", temprature=0.5)),  # type: ignore[call-arg]
    ("edit", lambda rt: rt.edit("a", 0, "again", temprature=0.5)),  # type: ignore[call-arg]
    ("complete", lambda rt: rt.complete([{"role": "user", "content": "x"}], temprature=0.5)),  # type: ignore[call-arg]
    (
        "complete_stream",
        lambda rt: _drain(rt.complete_stream([{"role": "user", "content": "x"}], temprature=0.5)),  # type: ignore[call-arg]
    ),
    ("run", lambda rt: rt.run("a", "hi", tools=[add], temprature=0.5)),  # type: ignore[call-arg]
]


@pytest.mark.parametrize(("method", "call"), TYPO_CALLS, ids=[c[0] for c in TYPO_CALLS])
async def test_a_misspelt_keyword_is_refused_before_anything_is_queued(
    method: str, call: Callable[[Runtime], Awaitable[Any]]
) -> None:
    async with Runtime.serve(ScriptedBackend(), MemoryStore()) as rt:
        await rt.chat("a", "hello")
        before = (rt.store.list(), rt.store.export("a"), rt.stats().scheduler.submitted)
        with pytest.raises(InvalidSampling) as info:
            await call(rt)
        assert str(info.value) == "invalid sampling temprature=0.5: not a sampling setting"
        assert isinstance(info.value, ValueError)
        assert (rt.store.list(), rt.store.export("a"), rt.stats().scheduler.submitted) == before


async def test_the_agent_loop_takes_sampling_only() -> None:
    async with Runtime.serve(ScriptedBackend(), MemoryStore()) as rt:
        with pytest.raises(InvalidSampling, match="response_format"):
            await rt.run("a", "hi", tools=[add], response_format="json")  # type: ignore[call-arg]
        assert rt.stats().scheduler.submitted == 0


async def test_edit_with_a_response_format() -> None:
    def reply(messages: Sequence[dict[str, Any]]) -> str:
        if messages[-1]["content"] == "Is 91 prime?":
            return '{"answer": "no", "confidence": 0.75}'
        return "echo"

    backend = Recording(reply)
    async with Runtime.serve(backend, MemoryStore()) as rt:
        first = await rt.chat("a", "Is 7 prime?")
        edited = await rt.edit("a", 0, "Is 91 prime?", response_format=Verdict, temperature=0.0, max_tokens=40)
        assert (first.text, first.parsed) == ("echo", None)
        assert edited.parsed == Verdict(answer="no", confidence=0.75)
        assert (edited.text, edited.finish_reason) == ('{"answer": "no", "confidence": 0.75}', "stop")
        session = await rt.get_session("a")
        assert [(m.role, m.content) for m in session.messages] == [
            ("user", "Is 91 prime?"),
            ("assistant", '{"answer": "no", "confidence": 0.75}'),
        ]
    plain, structured = backend.requests
    assert plain.grammar is None
    assert structured.grammar is not None and structured.grammar.prefill == "assistant: "
    assert (structured.sampling.temperature, structured.sampling.max_tokens) == (0.0, 40)


async def test_edit_with_tools_then_the_results() -> None:
    call = '{"tool_call": {"name": "add", "arguments": {"a": 12, "b": 30}}}'

    def reply(messages: Sequence[dict[str, Any]]) -> str:
        last = messages[-1]
        if "tool_response" in last["content"]:  # the generic format renders a tool result as a user message
            return '{"response": "It is 42."}'
        return call if last["content"] == "What is 12 + 30?" else "echo"

    backend = Recording(reply)
    async with Runtime.serve(backend, MemoryStore()) as rt:
        await rt.chat("a", "What is 1 + 1?")
        edited = await rt.edit("a", 0, "What is 12 + 30?", tools=[add], tool_choice="required")
        assert edited.finish_reason == "tool_calls"
        assert [(c.name, c.arguments) for c in edited.tool_calls] == [("add", {"a": 12, "b": 30})]
        answer = await rt.chat("a", tool_results={edited.tool_calls[0].id: 42}, tools=[add])
        assert (answer.text, answer.finish_reason, answer.tool_calls) == ("It is 42.", "stop", ())
        session = await rt.get_session("a")
        assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
        assert session.messages[1].tool_calls == edited.tool_calls
        assert session.messages[2].content == "42"
    assert backend.requests[1].grammar is not None  # "required": the call is constrained from the start


async def test_edit_refuses_two_constraints_and_changes_nothing() -> None:
    async with Runtime.serve(ScriptedBackend(), MemoryStore()) as rt:
        await rt.chat("a", "hello")
        before = (rt.store.export("a"), rt.stats().scheduler.submitted)
        with pytest.raises(ValueError, match="use response_format alone, not with tools"):
            await rt.edit("a", 0, "x", response_format="json", tools=[add])
        assert (rt.store.export("a"), rt.stats().scheduler.submitted) == before


# --- the config ------------------------------------------------------------------------------------


async def test_serve_takes_a_config_and_loop_overrides() -> None:
    config = RuntimeConfig.build(policy="affinity", max_queued=3, context="window")
    async with Runtime.serve(ScriptedBackend(), MemoryStore(), config) as rt:
        assert rt.config is config  # no overrides: the very config, not a checked copy
        assert (rt.scheduler.policy.name, rt.scheduler.max_queued, rt._turns.context) == ("affinity", 3, "window")
    async with Runtime.serve(ScriptedBackend(), MemoryStore(), config, max_queued=7) as rt:
        scheduler = rt.config.scheduler
        assert (scheduler.policy, scheduler.max_queued, rt.config.context) == ("affinity", 7, "window")
        assert rt.scheduler.max_queued == 7


BAD_LOOP: list[LoopOptions] = [
    {"policy": "lifo"},
    {"max_queued": 0},
    {"max_queued": True},
    {"context": "shift"},  # type: ignore[typeddict-item]
]


@pytest.mark.parametrize("options", BAD_LOOP, ids=[str(o) for o in BAD_LOOP])
async def test_bad_loop_settings_are_config_errors(options: LoopOptions) -> None:
    backend = ScriptedBackend()
    with pytest.raises(InvalidConfig):
        async with Runtime.serve(backend, MemoryStore(), **options):
            pass  # pragma: no cover
    with pytest.raises(InvalidConfig):
        RuntimeConfig.build(**options)
    assert not backend.closed  # refused before the runtime took the backend


@pytest.mark.parametrize(
    ("cache_ram_mib", "limit"), [(0, None), (-1, 0), (5, 5 << 20)], ids=["off", "no limit", "5 MiB"]
)
def test_the_ram_limit_is_derived_once(cache_ram_mib: int, limit: int | None) -> None:
    config = RuntimeConfig.build(cache_ram_mib=cache_ram_mib, disk_limit_mib=3).cache
    assert (config.ram_limit, config.disk_limit_bytes) == (limit, 3 << 20)
    default = RuntimeConfig().cache.ram_limit
    assert default is not None and 0 < default <= 8192 << 20


def test_settings_are_named_once_and_grouped() -> None:
    config = RuntimeConfig.build(
        n_ctx=4096, shared_blocks=64, policy="affinity", cache_rules="llama-server", reasoning="off"
    )
    assert (config.engine.n_ctx, config.cache.shared_blocks, config.scheduler.policy) == (4096, 64, "affinity")
    assert config.cache.rules is LLAMA_SERVER and not config.cache.rules.speculation
    assert config.reasoning.mode == "off"
    again = config.replace(max_queued=3, reasoning_budget=5)
    assert (again.scheduler.policy, again.scheduler.max_queued) == ("affinity", 3)
    assert (again.reasoning.mode, again.reasoning.budget, again.engine) == ("off", 5, config.engine)
    with pytest.raises(InvalidConfig, match="unknown setting 'n_gpus'"):
        RuntimeConfig.build(n_gpus=2)
    with pytest.raises(InvalidConfig, match="speculative='ngram' needs cache_rules='turnstile'"):
        RuntimeConfig.build(cache_rules="llama-server", speculative="ngram")
    with pytest.raises(InvalidConfig, match="cache_rules must be"):
        CacheRuleSet.named("mine")  # type: ignore[arg-type]
