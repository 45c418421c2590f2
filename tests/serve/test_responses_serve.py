"""The Responses API against a real `turnstile serve` process (SmolLM2), driven by the official `openai`
client: create and stream, a 5-turn `previous_response_id` chain that sends only its new input and reuses
the whole previous turn, the chain continued after a restart (disk tier), input items, delete, branches,
the bounded store, a tool round trip, per-key isolation, and strict request validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tests.support.process import ServeProcess

pytestmark = pytest.mark.slow

GEN: dict[str, Any] = {"model": "m", "temperature": 0, "max_output_tokens": 24}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def args(model: Path, *extra: str | Path) -> list[str | Path]:
    return ["--model", model, "--threads", "2", "--ctx", "2048", *extra]


def client(url: str, key: str = "none") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


async def test_chain_stream_items_restart_delete(smollm2_path: Path, tmp_path: Path) -> None:
    questions = ["Name a colour.", "Why that one?", "Name a fruit.", "Is it sweet?", "Name a city."]
    with ServeProcess(*args(smollm2_path, "--data-dir", tmp_path)) as srv:
        oai = client(srv.url)
        first = await oai.responses.create(input=questions[0], instructions="You are terse.", **GEN)
        assert first.id.startswith("resp_") and first.object == "response" and first.store is True
        assert first.output_text and first.output[0].type == "message"
        assert first.usage is not None and first.usage.input_tokens_details.cached_tokens == 0
        assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
        chain, history = [first], [user(questions[0]), assistant(first.output_text)]
        for q in questions[1:]:
            prev = chain[-1]
            r = await oai.responses.create(input=q, previous_response_id=prev.id, instructions="You are terse.", **GEN)
            assert r.previous_response_id == prev.id and r.usage is not None and prev.usage is not None
            # the whole previous turn comes from the slot, its last sampled token too (committed after the reply)
            assert r.usage.input_tokens_details.cached_tokens >= prev.usage.total_tokens
            assert r.usage.input_tokens > prev.usage.total_tokens
            chain.append(r)
            history += [user(q), assistant(r.output_text)]
        # the same conversation resent whole, statelessly: the same last reply, the same prompt
        whole = await oai.responses.create(input=history[:-1], instructions="You are terse.", store=False, **GEN)  # type: ignore[arg-type]
        assert whole.output_text == chain[-1].output_text
        assert whole.usage is not None and whole.usage.input_tokens == chain[-1].usage.input_tokens  # type: ignore[union-attr]
        with pytest.raises(openai.NotFoundError):
            await oai.responses.retrieve(whole.id)  # store false: nothing kept

        # streamed, continuing the chain
        events = []
        async with oai.responses.stream(
            input="Say hello.", previous_response_id=chain[-1].id, model="m", temperature=0, max_output_tokens=64
        ) as stream:
            async for ev in stream:
                events.append(ev)
            final = await stream.get_final_response()
        assert [e.sequence_number for e in events] == list(range(len(events)))
        kinds = [e.type for e in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-4:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == final.output_text and final.status == "completed"
        got = await oai.responses.retrieve(final.id)
        assert got.output_text == final.output_text and got.output[0].id == final.output[0].id

        # input items: this request's items, newest first by default, paginated
        items = await oai.responses.input_items.list(chain[2].id)
        assert [i.type for i in items.data] == ["message"] and items.has_more is False
        assert items.data[0].content[0].text == questions[2]  # type: ignore[union-attr]
        many = await oai.responses.create(input=[user("One."), user("Two."), user("Three.")], **GEN)
        page = await oai.responses.input_items.list(many.id, limit=2)
        assert [i.content[0].text for i in page.data] == ["Three.", "Two."] and page.has_more  # type: ignore[union-attr]
        rest = await oai.responses.input_items.list(many.id, limit=2, after=page.last_id)
        assert [i.content[0].text for i in rest.data] == ["One."] and not rest.has_more  # type: ignore[union-attr]
        asc = await oai.responses.input_items.list(many.id, order="asc")
        assert [i.content[0].text for i in asc.data] == ["One.", "Two.", "Three."]  # type: ignore[union-attr]

        # a branch from the chain's end (not stored) is the control for after the restart
        control = await oai.responses.create(input="Name a dog.", previous_response_id=chain[-1].id, store=False, **GEN)
        await oai.responses.delete(many.id)
        with pytest.raises(openai.NotFoundError):
            await oai.responses.retrieve(many.id)
    assert srv.returncode == 0

    with ServeProcess(*args(smollm2_path, "--data-dir", tmp_path)) as srv:
        oai = client(srv.url)
        again = await oai.responses.create(input="Name a dog.", previous_response_id=chain[-1].id, **GEN)
        assert again.output_text == control.output_text
        assert again.usage is not None and chain[-1].usage is not None
        assert again.usage.input_tokens_details.cached_tokens >= chain[-1].usage.total_tokens  # from disk
        assert (await oai.responses.retrieve(chain[0].id)).output_text == first.output_text
        with pytest.raises(openai.NotFoundError) as gone:
            await oai.responses.create(input="Hi.", previous_response_id=many.id, **GEN)
        assert many.id in str(gone.value)

        # unknown fields are ignored (a client release may add one); wrongly typed ones are 400 and keep nothing
        ok = await oai.responses.create(input="Hi.", **GEN, store=False, extra_body={"colour": "red"})
        assert ok.id.startswith("resp_") and ok.status in ("completed", "incomplete")  # (a short max_output_tokens)
        with pytest.raises(openai.BadRequestError) as bad:
            await oai.responses.create(input=[{"role": "user", "content": 3}], **GEN)  # type: ignore[list-item]
        assert "input[0]" in str(bad.value)
    assert srv.returncode == 0


async def test_branches_and_bounded_store(smollm2_path: Path, tmp_path: Path) -> None:
    limit = 6000
    extra = ("--data-dir", tmp_path, "--responses-max", "3", "--responses-max-bytes", str(limit))
    store_dir = tmp_path / "responses"

    def on_disk() -> int:
        return sum(p.stat().st_size for p in store_dir.iterdir())

    with ServeProcess(*args(smollm2_path, *extra)) as srv:
        oai = client(srv.url)
        root = await oai.responses.create(input="Name a colour.", **GEN)
        left = await oai.responses.create(input="Name a fruit.", previous_response_id=root.id, **GEN)
        right = await oai.responses.create(input="Name a city.", previous_response_id=root.id, **GEN)  # a branch
        base = [user("Name a colour."), assistant(root.output_text)]
        for branch, q in ((left, "Name a fruit."), (right, "Name a city.")):
            want = await oai.responses.create(input=[*base, user(q)], store=False, **GEN)  # type: ignore[arg-type]
            assert branch.output_text == want.output_text
        # the parent is unchanged: continuing it again is the first branch again
        twin = await oai.responses.create(input="Name a fruit.", previous_response_id=root.id, store=False, **GEN)
        assert twin.output_text == left.output_text
        assert on_disk() <= limit and len(list(store_dir.iterdir())) == 3

        await oai.responses.retrieve(root.id)  # root and right used since left: left is the LRU
        await oai.responses.retrieve(right.id)
        newest = await oai.responses.create(input="Name a tree.", previous_response_id=right.id, **GEN)
        with pytest.raises(openai.NotFoundError) as evicted:
            await oai.responses.retrieve(left.id)
        assert left.id in str(evicted.value) and "evicted" in str(evicted.value)
        with pytest.raises(openai.NotFoundError):
            await oai.responses.create(input="More.", previous_response_id=left.id, **GEN)
        assert on_disk() <= limit and len(list(store_dir.iterdir())) == 3
    with ServeProcess(*args(smollm2_path, *extra)) as srv:
        oai = client(srv.url)
        for kept in (root, right, newest):
            assert (await oai.responses.retrieve(kept.id)).output_text == kept.output_text
        with pytest.raises(openai.NotFoundError):
            await oai.responses.retrieve(left.id)


async def test_tool_round_trip_and_stream(smollm2_path: Path) -> None:
    with ServeProcess(*args(smollm2_path)) as srv:
        oai = client(srv.url)
        r = await oai.responses.create(
            input="Weather in Paris?", tools=[TOOL], tool_choice="required", **{**GEN, "max_output_tokens": 64}
        )  # type: ignore[list-item]
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
        assert isinstance(json.loads(calls[0].arguments), dict)
        done = await oai.responses.create(
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
            previous_response_id=r.id,
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice="none",
            **GEN,
        )
        assert done.output_text and not [o for o in done.output if o.type == "function_call"]
        # the same round trip resent whole and statelessly: the same prompt, found in the cache
        whole = await oai.responses.create(
            input=[
                user("Weather in Paris?"),
                {
                    "type": "function_call",
                    "call_id": calls[0].call_id,
                    "name": "get_weather",
                    "arguments": calls[0].arguments,
                },
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
            ],  # type: ignore[list-item]
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice="none",
            store=False,
            **GEN,
        )
        # the same prompt token for token (the answers themselves may differ by a greedy near-tie: the chain
        # evaluated its history in other batch shapes than the resend, which reuses the chain's state)
        assert whole.usage is not None and done.usage is not None
        assert whole.usage.input_tokens == done.usage.input_tokens
        assert whole.usage.input_tokens_details.cached_tokens >= done.usage.input_tokens - 1
        assert whole.output_text

        async with oai.responses.stream(
            input="Weather in Paris?",
            tools=[TOOL],
            tool_choice="required",
            model="m",
            temperature=0,
            max_output_tokens=64,
        ) as stream:  # type: ignore[arg-type]
            events = [ev async for ev in stream]
            final = await stream.get_final_response()
        args_events = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [(e.name, e.arguments) for e in args_events] == [("get_weather", calls[0].arguments)]  # type: ignore[union-attr]
        streamed = [o for o in final.output if o.type == "function_call"]
        assert [(c.name, c.arguments) for c in streamed] == [("get_weather", calls[0].arguments)]


async def test_keys_are_isolated(smollm2_path: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice: key-a\nbob: key-b\n")
    with ServeProcess(*args(smollm2_path, "--api-key-file", keys)) as srv:
        a, b = client(srv.url, "key-a"), client(srv.url, "key-b")
        r = await a.responses.create(input="Name a colour.", **GEN)
        with pytest.raises(openai.NotFoundError):
            await b.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            await b.responses.input_items.list(r.id)
        with pytest.raises(openai.NotFoundError):
            await b.responses.create(input="More.", previous_response_id=r.id, **GEN)
        with pytest.raises(openai.NotFoundError):
            await b.responses.delete(r.id)
        with pytest.raises(openai.AuthenticationError):
            await client(srv.url, "key-c").responses.retrieve(r.id)
        assert (await a.responses.retrieve(r.id)).output_text == r.output_text
        assert (await a.responses.input_items.list(r.id)).data[0].content[0].text == "Name a colour."  # type: ignore[union-attr]
        more = await a.responses.create(input="Why?", previous_response_id=r.id, **GEN)
        assert more.usage is not None and more.usage.input_tokens_details.cached_tokens > 0
