"""Bad input to every public Runtime method: a typed error, raised before anything is queued, and the
store exactly as it was (its export byte-identical, no session created)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from runtime import InvalidConfig, InvalidRequest, Runtime, TurnstileError
from runtime.errors import InvalidTool, ResponseFormatError, UnsupportedSchema
from runtime.log import capture_logs
from runtime.testing import ScriptedBackend
from sessions import InvalidHistoryOp, InvalidSampling, InvalidSession, InvalidSessionId, MemoryStore, SessionNotFound

Call = Callable[[Runtime], Awaitable[Any]]


async def _drain(rt: Runtime, sid: str, msg: Any) -> None:
    async for _ in rt.stream(sid, msg):
        pass


def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def unannotated(a, b):  # type: ignore[no-untyped-def]
    return a


NOT_ENFORCEABLE = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}

CASES: list[tuple[str, Call, type[TurnstileError]]] = [
    ("tool_choice names no tool", lambda rt: rt.chat("a", "hi", tools=[add], tool_choice="nope"), InvalidTool),
    ("function with unannotated parameters", lambda rt: rt.chat("a", "hi", tools=[unannotated]), InvalidTool),
    (
        "tool dict without a name",
        lambda rt: rt.chat("a", "hi", tools=[{"type": "function", "function": {}}]),
        InvalidTool,
    ),
    ("tool_choice without tools", lambda rt: rt.chat("a", "hi", tool_choice="required"), InvalidRequest),
    ("tool results for an unknown call", lambda rt: rt.chat("a", tool_results={"call_x": 1}), InvalidHistoryOp),
    ("message and tool results", lambda rt: rt.chat("a", "hi", tool_results={"call_x": 1}), InvalidRequest),
    ("neither message nor results", lambda rt: rt.chat("a"), InvalidRequest),
    (
        "schema with a remote ref",
        lambda rt: rt.chat("a", "hi", response_format={"$ref": "http://x/y"}),
        UnsupportedSchema,
    ),
    (
        "schema keyword no grammar enforces",
        lambda rt: rt.chat("a", "hi", response_format=NOT_ENFORCEABLE),
        UnsupportedSchema,
    ),
    ("response format of another kind", lambda rt: rt.chat("a", "hi", response_format=3), ResponseFormatError),
    ("response format and tools", lambda rt: rt.chat("a", "hi", response_format="json", tools=[add]), InvalidRequest),
    ("grammar without a root", lambda rt: rt.chat("a", "hi", grammar='x ::= "y"'), InvalidRequest),
    ("grammar not a str", lambda rt: rt.chat("a", "hi", grammar=5), InvalidRequest),  # type: ignore[arg-type]
    ("chat None", lambda rt: rt.chat("a", None), InvalidRequest),  # type: ignore[arg-type]
    ("chat None, new id", lambda rt: rt.chat("new", None), InvalidRequest),  # type: ignore[arg-type]
    ("chat bytes", lambda rt: rt.chat("a", b"hi"), InvalidRequest),  # type: ignore[arg-type]
    ("chat lone surrogate", lambda rt: rt.chat("a", "\ud800"), InvalidRequest),
    ("chat lone surrogate, new id", lambda rt: rt.chat("new", "x\udfffy"), InvalidRequest),
    ("chat bad id", lambda rt: rt.chat("bad id!", "hi"), InvalidSessionId),
    ("chat id not a str", lambda rt: rt.chat(7, "hi"), InvalidSessionId),  # type: ignore[arg-type]
    ("chat timeout str", lambda rt: rt.chat("a", "hi", timeout="soon"), InvalidRequest),  # type: ignore[arg-type]
    ("chat timeout 0", lambda rt: rt.chat("a", "hi", timeout=0), InvalidRequest),
    ("chat timeout nan", lambda rt: rt.chat("a", "hi", timeout=float("nan")), InvalidRequest),
    ("chat sampling", lambda rt: rt.chat("a", "hi", temperature=-1), InvalidSampling),
    ("chat unknown setting", lambda rt: rt.chat("a", "hi", warmth=1), InvalidSampling),
    ("stream None", lambda rt: _drain(rt, "a", None), InvalidRequest),
    ("stream surrogate", lambda rt: _drain(rt, "new", "\ud800"), InvalidRequest),
    ("regenerate unknown", lambda rt: rt.regenerate("nobody"), SessionNotFound),
    ("regenerate timeout", lambda rt: rt.regenerate("a", timeout=-1), InvalidRequest),
    ("edit None", lambda rt: rt.edit("a", 0, None), InvalidRequest),  # type: ignore[arg-type]
    ("edit surrogate", lambda rt: rt.edit("a", 0, "\ud800"), InvalidRequest),
    ("edit index str", lambda rt: rt.edit("a", "0", "x"), InvalidRequest),  # type: ignore[arg-type]
    ("edit index out of range", lambda rt: rt.edit("a", 9, "x"), InvalidHistoryOp),
    ("edit an assistant message", lambda rt: rt.edit("a", 1, "x"), InvalidHistoryOp),
    ("undo 0", lambda rt: rt.undo("a", 0), InvalidRequest),
    ("undo too many", lambda rt: rt.undo("a", 5), InvalidHistoryOp),
    ("undo str", lambda rt: rt.undo("a", "1"), InvalidRequest),  # type: ignore[arg-type]
    ("fork onto a bad id", lambda rt: rt.fork("a", "bad id"), InvalidSessionId),
    ("fork upto -1", lambda rt: rt.fork("a", "b", upto=-1), InvalidRequest),
    ("fork unknown", lambda rt: rt.fork("nobody", "b"), SessionNotFound),
    ("delete unknown", lambda rt: rt.delete("nobody"), SessionNotFound),
    ("delete bad id", lambda rt: rt.delete("bad id"), InvalidSessionId),
    ("export unknown", lambda rt: rt.export("nobody"), SessionNotFound),
    ("import garbage", lambda rt: rt.import_("{not json"), InvalidSession),
    ("import overwrite not bool", lambda rt: rt.import_("[]", new_id="z", overwrite="yes"), InvalidRequest),  # type: ignore[arg-type]
    ("create system None ok, int not", lambda rt: rt.create_session("n", system=5), InvalidRequest),  # type: ignore[arg-type]
    ("create surrogate system", lambda rt: rt.create_session("n", system="\ud800"), InvalidRequest),
    ("create bad sampling", lambda rt: rt.create_session("n", top_p=2), InvalidSampling),
    ("create bad metadata", lambda rt: rt.create_session("n", metadata={"k": object()}), InvalidSession),
    ("create metadata not a dict", lambda rt: rt.create_session("n", metadata=[1]), InvalidRequest),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("name", "call", "error"), CASES, ids=[c[0] for c in CASES])
async def test_bad_input_changes_nothing(name: str, call: Call, error: type[TurnstileError]) -> None:
    async with Runtime.serve(ScriptedBackend(), MemoryStore()) as rt:
        await rt.chat("a", "hello")
        before = (rt.store.list(), rt.store.export("a"))
        submitted = rt.stats().scheduler.submitted
        with pytest.raises(error):
            await call(rt)
        assert (rt.store.list(), rt.store.export("a")) == before
        queued_ok = error in (SessionNotFound, InvalidHistoryOp)  # known only once the session is read
        assert rt.stats().scheduler.submitted == submitted + (1 if queued_ok else 0)


async def test_a_tool_schema_keyword_no_grammar_enforces_is_accepted_and_logged() -> None:
    """Coding agents send tool schemas with keywords no grammar enforces: the tool is offered, the rest of its
    schema enforced, and a warning names the keyword (a `response_format` asking for one stays an error,
    above)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": NOT_ENFORCEABLE}}
    async with Runtime.serve(ScriptedBackend(), MemoryStore()) as rt:
        with capture_logs() as logs:
            reply = await rt.chat("a", "hi", tools=[tool])
        assert reply.finish_reason == "stop"
        warned = [e for e in logs if e["event"] == "tools.schema_partly_enforced"]
        assert [e["tool"] for e in warned] == ["f"] and "multipleOf" in warned[0]["reason"]
        assert [m.role for m in rt.store.get("a").messages] == ["user", "assistant"]


OPEN_CASES: list[tuple[str, dict[str, Any]]] = [
    ("n_ctx 0", {"n_ctx": 0}),
    ("policy", {"policy": "lifo"}),
    ("max_queued 0", {"max_queued": 0}),
    ("cache_ram_mib -2", {"cache_ram_mib": -2}),
    ("disk_limit_mib -1", {"disk_limit_mib": -1}),
    ("cache_rules", {"cache_rules": "mine"}),
    ("unknown engine option", {"n_gpus": 2}),
    ("type_k", {"type_k": "f8"}),
]


@pytest.mark.parametrize(("name", "options"), OPEN_CASES, ids=[c[0] for c in OPEN_CASES])
async def test_bad_open_options_are_typed_config_errors(name: str, options: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig) as info:
        async with Runtime.open(tmp_path / "no-model.gguf", data_dir=tmp_path / "data", **options):
            pass  # pragma: no cover
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "data").exists()  # nothing was created
