"""The rendering a turn runs, `Runtime.apply_template`, the `chat_template=` override and llama-server's
`/apply-template`, `/tokenize` and `/detokenize` routes, on the tiny generated model (real llama.cpp) through
httpx's ASGI transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from runtime import Runtime
from runtime.errors import ChatTemplateError, InvalidConfig
from runtime.serve.http import app as make_app
from runtime.templates import apply_template

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hello world"},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "say more"},
]
OVERRIDE = "{% for m in messages %}<|im_start|>{{ m.role }}|{{ m.content }}<|im_end|>{% endfor %}{{ '!' }}"


@asynccontextmanager
async def opened(model: Path) -> AsyncIterator[Runtime]:
    async with Runtime.open(model, n_ctx=512, n_threads=1) as runtime:
        yield runtime


async def post(runtime: Runtime, path: str, body: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=make_app(runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        return await c.post(path, json=body)


async def test_a_turn_runs_exactly_the_apply_template_prompt(tiny_llama: Path) -> None:
    async with opened(tiny_llama) as rt:
        prompt = await rt.apply_template(CHAT)
        engine: Any = rt.backend.engine  # type: ignore[attr-defined]
        assert prompt == apply_template(engine.template.source, CHAT, bos_token="<s>", eos_token="<|im_end|>")
        assert prompt.endswith("<|im_start|>user\nsay more<|im_end|>\n<|im_start|>assistant\n")
        assert rt.backend.prepare(CHAT).text == prompt
        assert rt.backend.prepare(CHAT, "s").text == prompt  # the incremental path too
        bare = await rt.apply_template(CHAT, add_generation_prompt=False)
        assert prompt == bare + "<|im_start|>assistant\n"


async def test_apply_template_refuses_bad_messages_with_a_typed_error(tiny_llama: Path) -> None:
    async with opened(tiny_llama) as rt:
        with pytest.raises(ChatTemplateError):
            await rt.apply_template([{"content": "no role"}])


async def test_chat_template_override_from_source_and_from_a_file(tiny_llama: Path, tmp_path: Path) -> None:
    path = tmp_path / "mine.jinja"
    path.write_text(OVERRIDE, encoding="utf-8")
    for value in (OVERRIDE, path, str(path)):
        async with Runtime.open(tiny_llama, n_ctx=512, n_threads=1, chat_template=value) as runtime:
            got = await runtime.apply_template(CHAT[1:2])
            assert got == "<|im_start|>user|hello world<|im_end|>!"
            assert runtime.backend.prepare(CHAT[1:2]).text == got
    with pytest.raises(InvalidConfig, match="no Jinja source and no readable file"):
        async with Runtime.open(tiny_llama, n_ctx=512, chat_template=tmp_path / "missing.jinja"):
            pass


async def test_apply_template_route(tiny_llama: Path) -> None:
    async with opened(tiny_llama) as rt:
        r = await post(rt, "/apply-template", {"messages": CHAT})
        assert r.status_code == 200
        assert r.json() == {"prompt": await rt.apply_template(CHAT)}
        r = await post(rt, "/apply-template", {"messages": CHAT, "add_generation_prompt": False})
        assert r.json() == {"prompt": await rt.apply_template(CHAT, add_generation_prompt=False)}
        for bad in ({}, {"messages": "x"}, {"messages": [{"content": "x"}]}, {"messages": CHAT, "tools": {}}):
            r = await post(rt, "/apply-template", bad)
            assert r.status_code == 400, bad
            assert r.json()["error"]["type"] == "invalid_request_error"


async def test_tokenize_and_detokenize_routes(tiny_llama: Path) -> None:
    async with opened(tiny_llama) as rt:
        engine: Any = rt.backend.engine  # type: ignore[attr-defined]
        text = "<|im_start|>hello world"
        want = engine.tokenize(text, add_special=False)
        assert want[0] == 3  # <|im_start|>, parsed as the special token
        r = await post(rt, "/tokenize", {"content": text})
        assert r.json() == {"tokens": want}
        r = await post(rt, "/tokenize", {"content": text, "add_special": True})
        assert r.json() == {"tokens": engine.tokenize(text, add_special=True)}
        r = await post(rt, "/tokenize", {"content": text, "with_pieces": True})
        pieces = r.json()["tokens"]
        assert [p["id"] for p in pieces] == want
        assert "".join(p["piece"] for p in pieces) == "<|im_start|> hello world"  # SPM's space prefix
        r = await post(rt, "/tokenize", {"content": ["hello", 4, " world"]})
        assert r.json() == {
            "tokens": [*engine.tokenize("hello", add_special=False), 4, *engine.tokenize(" world", add_special=False)]
        }
        r = await post(rt, "/detokenize", {"tokens": want})
        assert r.json() == {"content": "<|im_start|> hello world"}
        assert (await post(rt, "/tokenize", {})).json() == {"tokens": []}
        assert (await post(rt, "/detokenize", {})).json() == {"content": ""}
        for path, bad in (
            ("/tokenize", {"content": 3}),
            ("/tokenize", {"content": "x", "add_special": "yes"}),
            ("/tokenize", {"content": [1.5]}),
            ("/detokenize", {"tokens": [10**9]}),
            ("/detokenize", {"tokens": "1 2"}),
        ):
            r = await post(rt, path, bad)
            assert r.status_code == 400, (path, bad)
