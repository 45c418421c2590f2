"""Speculation chosen per session and per request (issue 28): the turn's choice, else the session's, else the
Runtime's; a misspelt value refused before anything is queued; the session's choice exported and imported;
llama-server's cache rules keep it off; the HTTP field (`"speculative"`, llama-server's `"speculative.n_max"`)
in all three dialects. Scripted backends check where each choice arrives (the slot request's flag); SmolLM2,
asked to copy a passage (a random tiny model never copies), checks that `usage.draft_n` follows the choice.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from runtime import Runtime
from runtime.backend.protocol import SlotRequest, SlotResult
from runtime.errors import InvalidConfig, InvalidSampling
from runtime.serve.http import app as make_app
from runtime.testing import ScriptedBackend
from sessions import MemoryStore, Session, history
from tests.support.uvicorn_server import uvicorn_server

PASSAGE = (
    "The old lighthouse stood at the edge of the northern cliffs, where the wind came in hard from the sea "
    "and the grass grew short and grey. For a hundred years its keepers had climbed the spiral stairs."
)
COPY = f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}"
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 32}


class Recording(ScriptedBackend):
    """A scripted backend that keeps each slot request's speculation flag."""

    def __init__(self) -> None:
        super().__init__()
        self.flags: list[bool | None] = []

    def run(self, req: SlotRequest) -> SlotResult:
        self.flags.append(req.speculative)
        return super().run(req)


@asynccontextmanager
async def recording() -> AsyncIterator[tuple[Runtime, Recording]]:
    backend = Recording()
    async with Runtime.serve(backend, MemoryStore()) as rt:
        yield rt, backend


# --- where the choice comes from (scripted) --------------------------------------------------------------


async def test_a_misspelt_choice_is_a_typed_error_and_nothing_is_queued() -> None:
    async with recording() as (rt, backend):
        calls: list[Callable[[], Any]] = [
            lambda: rt.chat("a", "hi", speculative="ngrm"),  # type: ignore[arg-type]
            lambda: rt.complete([{"role": "user", "content": "hi"}], speculative=True),  # type: ignore[arg-type]
            lambda: rt.create_session("b", speculative="on"),  # type: ignore[arg-type]
            lambda: rt.run("c", "hi", tools=[], speculative="eagle"),  # type: ignore[arg-type]
        ]
        for call in calls:
            with pytest.raises(InvalidSampling) as e:
                await call()
            assert e.value.field == "speculative"
            assert "must be None, 'ngram' or 'none'" in str(e.value)
        assert rt.stats().scheduler.submitted == 0
        assert await rt.list_sessions() == []
        assert backend.flags == []
    with pytest.raises(InvalidSampling):
        Session.new("s", sampling={"speculative": 1})


async def test_the_turn_wins_over_the_session_and_the_session_over_the_runtime() -> None:
    async with recording() as (rt, backend):
        await rt.create_session("on", speculative="ngram")
        await rt.create_session("off", speculative="none")
        await rt.chat("plain", "hi")  # nothing chosen: the slot's own setting (the Runtime's)
        await rt.chat("plain", "hi", speculative="ngram")
        await rt.chat("on", "hi")
        await rt.chat("on", "hi", speculative="none")
        await rt.chat("on", "hi", speculative=None)  # None: the runtime's, as for the reasoning controls
        await rt.chat("off", "hi")
        await rt.regenerate("off", speculative="ngram")
        await rt.edit("off", 0, "hello", speculative="ngram")
        async for _ in rt.stream("off", "more"):
            pass
        await rt.complete([{"role": "user", "content": "hi"}], speculative="ngram")
        await rt.complete([{"role": "user", "content": "hi"}], session_id="on")  # the named session's choice
        async for _ in rt.complete_stream([{"role": "user", "content": "hi"}], speculative="none"):
            pass
        await rt.run("agent", "hi", tools=[], speculative="ngram")
        assert backend.flags == [None, True, True, False, None, False, True, True, False, True, True, False, True]
        # the turn's choice is not stored: the session keeps its own
        assert (await rt.get_session("on")).sampling.speculative == "ngram"
        assert (await rt.get_session("plain")).sampling.speculative is None


async def test_the_session_choice_is_exported_and_imported() -> None:
    async with recording() as (rt, _):
        await rt.create_session("on", speculative="ngram", temperature=0.0)
        await rt.create_session("plain")
        doc = json.loads(await rt.export("on"))
        assert doc["sampling"]["speculative"] == "ngram"
        assert "speculative" not in json.loads(await rt.export("plain"))["sampling"]  # older documents' shape
        copy = await rt.import_(await rt.export("on"), new_id="copy")
        assert copy.sampling.speculative == "ngram"
        assert history.import_(await rt.export("plain")).sampling.speculative is None


async def post(rt: Runtime, path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=make_app(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        return await c.post(path, json=body)


BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi"},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
}


@pytest.mark.parametrize("path", list(BODIES))
async def test_every_dialect_reads_the_speculation_fields(path: str) -> None:
    async with recording() as (rt, backend):
        fields: list[dict[str, Any]] = [
            {},
            {"speculative": "ngram"},
            {"speculative": "none"},
            {"speculative": None},
            {"speculative.n_max": 0},  # llama-server's: no drafts
            {"speculative.n_max": 16},  # a cap turnstile does not have: changes nothing
            {"speculative": "ngram", "speculative.n_max": 8},
        ]
        for extra in fields:
            r = await post(rt, path, BODIES[path] | extra)
            assert r.status_code == 200, (extra, r.text)
        assert backend.flags == [None, True, False, None, False, None, True]
        for bad, param in [
            ({"speculative": "ngram-map-k"}, "speculative"),
            ({"speculative.n_max": -1}, "speculative.n_max"),
            ({"speculative": "ngram", "speculative.n_max": 0}, "speculative.n_max"),
        ]:
            r = await post(rt, path, BODIES[path] | bad)
            assert r.status_code == 400, (bad, r.text)
            assert param in r.text
        assert len(backend.flags) == len(fields)  # no turn ran for the refused ones


# --- on a real model: draft_n follows the choice -------------------------------------------------------


def _open(model: Path, **kw: Any) -> Any:
    return Runtime.open(model, n_ctx=2048, n_threads=1, cache_ram_mib=256, **kw)


async def test_draft_counts_follow_the_turn_and_the_session(smollm2_path: Path) -> None:
    async with _open(smollm2_path) as rt:  # the Runtime's default: off
        plain = await rt.chat("plain", COPY, **GREEDY)
        assert (plain.usage.draft_n, plain.usage.draft_n_accepted) == (0, 0)
        await rt.create_session("spec", speculative="ngram")
        spec = await rt.chat("spec", COPY, **GREEDY)
        assert spec.usage.draft_n_accepted >= spec.usage.generated_tokens // 2, spec.usage
        assert spec.text == plain.text  # one thread: the drafted batch gives the same greedy tokens
        again = await rt.regenerate("spec", speculative="none", **GREEDY)  # the turn wins over the session
        assert (again.usage.draft_n, again.text) == (0, plain.text)
        alone = await rt.complete([{"role": "user", "content": COPY}], speculative="ngram", **GREEDY)
        assert alone.usage.draft_n_accepted > 0 and alone.text == plain.text
        replies = [plain, spec, again, alone]
        slot = rt.stats().slot
        assert slot.draft_n == sum(r.usage.draft_n for r in replies)
        assert slot.draft_n_accepted == sum(r.usage.draft_n_accepted for r in replies)
    async with _open(smollm2_path, speculative="ngram") as rt:  # the Runtime's default: on
        await rt.create_session("off", speculative="none")
        off = await rt.chat("off", COPY, **GREEDY)
        on = await rt.chat("on", COPY, **GREEDY)
        assert off.usage.draft_n == 0 and on.usage.draft_n_accepted > 0
        assert off.text == on.text == plain.text


async def test_llama_server_rules_keep_speculation_off(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="cache_rules='turnstile'"):
        async with Runtime.open(tmp_path / "none.gguf", cache_rules="llama-server", speculative="ngram"):
            pass  # pragma: no cover
    async with _open(smollm2_path, cache_rules="llama-server") as rt:
        await rt.create_session("spec", speculative="ngram")
        r = await rt.chat("spec", COPY, speculative="ngram", **GREEDY)
        assert r.usage.generated_tokens == 32 and (r.usage.draft_n, r.usage.draft_n_accepted) == (0, 0)
        assert rt.stats().slot.draft_n == 0


@asynccontextmanager
async def served(model: Path, **kw: Any) -> AsyncIterator[tuple[str, Runtime]]:
    """A real uvicorn server on a free loopback port over a Runtime on `model` (the Runtime handed back too)."""
    opened: list[Runtime] = []

    @asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        async with _open(model, **kw) as rt:
            opened.append(rt)
            yield rt

    async with uvicorn_server(open_runtime, ready_within=120) as url:
        yield url, opened[0]


async def test_http_requests_choose_with_the_official_clients(smollm2_path: Path) -> None:
    async with served(smollm2_path, speculative="ngram") as (url, rt):  # `turnstile serve --spec ngram`
        oai = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        msgs: Any = [{"role": "user", "content": COPY}]

        async def chat(extra: dict[str, Any]) -> dict[str, Any]:
            r = await oai.chat.completions.create(model="m", messages=msgs, extra_body=extra, **GREEDY)
            return dict((r.model_extra or {})["timings"])

        on, off, n_max0 = await chat({}), await chat({"speculative": "none"}), await chat({"speculative.n_max": 0})
        assert on["draft_n_accepted"] > 0
        assert (off["draft_n"], n_max0["draft_n"]) == (0, 0)
        assert on["predicted_n"] == off["predicted_n"] == 32

        async def drafted(call: Callable[[], Any]) -> int:
            """What one call drafted, from the Runtime's counter (Responses and Messages report no timings)."""
            before = rt.stats().slot.draft_n
            await call()
            return rt.stats().slot.draft_n - before

        respond = oai.responses.create
        out = {"model": "m", "input": COPY, "max_output_tokens": 32, "temperature": 0.0}
        assert await drafted(lambda: respond(**out)) > 0
        assert await drafted(lambda: respond(**out, extra_body={"speculative": "none"})) == 0
        claude = AsyncAnthropic(base_url=url, api_key="none", max_retries=0)
        ask: Any = {"model": "m", "max_tokens": 32, "messages": msgs}
        greedy = {"temperature": 0.0}  # this client version has no temperature keyword
        assert await drafted(lambda: claude.messages.create(**ask, extra_body=greedy)) > 0
        off_body = greedy | {"speculative.n_max": 0}
        assert await drafted(lambda: claude.messages.create(**ask, extra_body=off_body)) == 0
        with pytest.raises(openai.BadRequestError) as e:
            await oai.chat.completions.create(model="m", messages=msgs, extra_body={"speculative": "ngrm"})
        assert e.value.status_code == 400 and "speculative" in str(e.value)
