"""The Responses API in-process on the scripted backend (no model): what the model is shown for chains,
branches and whole-input requests, the stored sessions (a parent never changes), reasoning items and the
streamed events, and the 400s of strict validation (nothing stored after them)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.reasoning import by_name
from runtime.serve.http import app as make_app
from runtime.serve.http.responses.store import ResponseStore
from runtime.testing import ScriptedBackend
from sessions import MemoryStore

pytestmark = pytest.mark.anyio


class Model:
    """A scripted model that records the messages of every turn and thinks before it answers."""

    def __init__(self) -> None:
        self.seen: list[list[dict[str, Any]]] = []

    def __call__(self, messages: Sequence[dict[str, Any]]) -> str:
        self.seen.append([{k: m[k] for k in ("role", "content") if k in m} for m in messages])
        return f"<think>about {messages[-1].get('content', '')}</think>re: {messages[-1].get('content', '')}"


@asynccontextmanager
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, Model, Runtime, ResponseStore]]:
    model, store = Model(), ResponseStore(max_responses=4)
    async with Runtime.serve(ScriptedBackend(model, reasoning=by_name("think")), MemoryStore()) as rt:
        transport = httpx.ASGITransport(app=make_app(rt, responses=store))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            yield c, model, rt, store


async def create(c: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await c.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def text(resp: dict[str, Any]) -> str:
    return "".join(p["text"] for o in resp["output"] if o["type"] == "message" for p in o["content"])


async def test_chain_and_branches_show_the_model_the_right_history() -> None:
    async with served() as (c, model, rt, store):
        root = await create(c, input="one", instructions="Be brief.")
        assert [o["type"] for o in root["output"]] == ["reasoning", "message"]
        assert root["output"][0]["content"] == [{"type": "reasoning_text", "text": "about one"}]
        assert text(root) == "re: one" and root["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
        a = await create(c, input="two", previous_response_id=root["id"])  # no instructions: none carried
        b = await create(c, input="three", previous_response_id=root["id"], instructions="Be kind.")
        assert model.seen == [
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one"}],
            [
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "re: one"},
                {"role": "user", "content": "two"},
            ],
            [
                {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "re: one"},
                {"role": "user", "content": "three"},
            ],
        ]
        ra, rb, rr = (store.get("default", x["id"]) for x in (a, b, root))
        assert ra.session == rr.session and rb.session != rr.session  # in place, then a branch
        assert (ra.upto, rb.upto, rr.upto) == (4, 4, 2)
        parent = await rt.get_session(rr.session)
        assert [m.content for m in parent.messages] == ["one", "re: one", "two", "re: two"]
        branch = await rt.get_session(rb.session)
        assert [m.content for m in branch.messages] == ["one", "re: one", "three", "re: three"]
        assert branch.messages[1].reasoning == "about one"  # the reasoning goes back with the history

        await c.delete(f"/v1/responses/{a['id']}")
        assert (await rt.get_session(rr.session)).id == rr.session  # root still points into it
        await c.delete(f"/v1/responses/{root['id']}")
        assert rr.session not in await rt.list_sessions()  # nothing points into it: deleted


async def test_input_items_become_messages_like_llama_servers() -> None:
    async with served() as (c, model, _rt, _store):
        items = [
            {"role": "developer", "content": "Rules."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ]
        r = await create(c, input=items, store=False)
        assert model.seen[-1] == [
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": ""},
            {"role": "tool", "content": "rain"},
        ]
        assert (await c.get(f"/v1/responses/{r['id']}")).status_code == 404  # store false: nothing kept


async def test_stream_events_are_numbered_and_complete() -> None:
    async with served() as (c, _model, _rt, _store):
        async with c.stream("POST", "/v1/responses", json={"input": "hi", "stream": True}) as r:
            raw = (await r.aread()).decode()
        events = [json.loads(block.split("\ndata: ", 1)[1]) for block in raw.strip().split("\n\n")]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        kinds = [e["type"] for e in events]
        assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
        assert kinds[-1] == "response.completed" and "response.reasoning_text.done" in kinds
        final = events[-1]["response"]
        assert (
            text(final) == "re: hi" == "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        )
        reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
        assert reasoning == "about hi" == final["output"][0]["content"][0]["text"]
        added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
        assert added == [o["id"] for o in final["output"]]
        stored = (await c.get(f"/v1/responses/{final['id']}")).json()
        assert stored["output"] == final["output"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": 3}, "input"),
        ({"input": [{"role": "user", "content": 3}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": "a"}, {"type": "item_reference", "id": "msg_1"}]}, "input[1]"),
        ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": 3}]}, "tools"),
        ({"input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "arguments"),
        ({"input": "hi", "previous_response_id": "resp_nope"}, "resp_nope"),
        ({"input": "hi", "background": True}, "background"),
    ],
)
async def test_bad_requests_are_400_or_404_and_store_nothing(body: dict[str, Any], needle: str) -> None:
    async with served() as (c, model, rt, store):
        r = await c.post("/v1/responses", json=body)
        assert r.status_code == (404 if "previous_response_id" in body else 400), r.text
        err = r.json()["error"]
        assert needle in err["message"] or needle == err["param"], err
        assert model.seen == [] and store.stats().responses == 0 and await rt.list_sessions() == []


async def test_input_items_paging_args_are_checked() -> None:
    async with served() as (c, _model, _rt, _store):
        r = await create(c, input="hi")
        for query in ("limit=0", "limit=x", "order=up", "after=msg_nope"):
            bad = await c.get(f"/v1/responses/{r['id']}/input_items?{query}")
            assert bad.status_code == 400, query
        page = (await c.get(f"/v1/responses/{r['id']}/input_items")).json()
        assert page["object"] == "list" and [i["content"][0]["text"] for i in page["data"]] == ["hi"]
        assert page["first_id"] == page["last_id"] == page["data"][0]["id"] and page["has_more"] is False
