"""Render parity: `apply_template` equals llama-server's `POST /apply-template` for every template llama.cpp keeps.

For each of the 70 templates in the vendored `models/templates/` (llama-cpp-python 0.3.36's llama.cpp, fetched
into an ignored cache, never copied here), one llama-server runs with `--jinja --chat-template-file` on a tiny
generated GGUF (BOS `<s>`, EOS `<|im_end|>`) and `--no-prefill-assistant`, and every conversation of
`tests/support/template_cases.py` (system + user, three turns, tools offered, a tool call and its result, parallel calls
with object arguments, reasoning on earlier and last assistant turns, a trailing assistant message,
`enable_thinking` true / false, `preserve_reasoning` false, typed content, a developer message, ...) is rendered
by both. Equal means the same prompt string, or both refusing the conversation (llama-server answers an error,
`apply_template` raises ChatTemplateError: Gemma 2 with tool messages, Mistral templates without an assistant
message after tool results). The test prints one line per template (`name: N/N equal (k refused by both)`).

A template where they differ must be listed in KNOWN_DIFFERENCES with a demonstrated llama-server bug as the
reason; none is. Runs only when TURNSTILE_LLAMA_SERVER names a llama-server binary.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from runtime.errors import ChatTemplateError
from tests.support.llama_server import LlamaServer
from tests.support.oracle import llama_server_binary
from tests.support.template_cases import CASES, render_body
from tests.support.tiny_models import write_llama
from tests.support.vendor_tree import vendored_tree

_BINARY = llama_server_binary()
N_TEMPLATES = 70

KNOWN_DIFFERENCES: dict[str, str] = {}  # template file -> the llama-server bug that makes them differ

pytestmark = [pytest.mark.oracle]  # the oracle gate is in tests/conftest.py (CI fails without a binary)


class Refused:
    """A conversation the renderer refused (an HTTP error from llama-server, ChatTemplateError here)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"Refused({self.why[:200]!r})"


def server_render(url: str, body: dict[str, Any]) -> str | Refused:
    req = urllib.request.Request(
        url + "/apply-template", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return str(json.loads(r.read())["prompt"])
    except urllib.error.HTTPError as e:
        return Refused(f"HTTP {e.code}: {e.read().decode(errors='replace')}")


def our_render(source: str, body: dict[str, Any]) -> str | Refused:
    try:
        return render_body(source, body)
    except ChatTemplateError as e:
        return Refused(str(e))


def test_every_vendored_template_renders_as_llama_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    templates = sorted((vendored_tree() / "models" / "templates").glob("*.jinja"))
    assert len(templates) == N_TEMPLATES
    model = write_llama(tmp_path / "tiny.gguf", n_ctx=512)
    differences: list[str] = []
    total_equal = total_refused = 0
    for path in templates:
        source = path.read_text(encoding="utf-8")
        extra = ["--chat-template-file", str(path), "--no-prefill-assistant"]
        equal = refused = 0
        with LlamaServer(_BINARY, model, n_ctx=512, threads=1, cache_ram_mib=0, extra_args=extra) as server:
            for name, body in CASES:
                theirs, ours = server_render(server.url, body), our_render(source, body)
                if isinstance(theirs, Refused) and isinstance(ours, Refused):
                    refused += 1
                elif theirs == ours:
                    equal += 1
                elif path.name not in KNOWN_DIFFERENCES:
                    differences.append(f"{path.name} / {name}:\n  llama-server {theirs!r}\n  turnstile    {ours!r}")
        same = equal + refused
        total_equal, total_refused = total_equal + equal, total_refused + refused
        with capsys.disabled():
            print(f"{path.name}: {same}/{len(CASES)} equal ({refused} refused by both)")
    with capsys.disabled():
        print(f"all: {total_equal} equal renders, {total_refused} refused by both, {len(differences)} different")
    assert not differences, "\n".join(differences)
    assert total_equal > total_refused * 10  # the comparison is of renders, not of errors


TOKENIZE_BODIES: list[dict[str, Any]] = [
    {"content": "hello world"},
    {"content": "<|im_start|>user\nhi there<|im_end|>", "add_special": True},
    {"content": "<|im_start|>user", "parse_special": False},
    {"content": "ünïcödé ✓ 日本語 🐍", "with_pieces": True},
    {"content": ["hello", 4, " world"], "with_pieces": True},
    {},
]
DETOKENIZE_BODIES: list[dict[str, Any]] = [{"tokens": [3, 300, 301, 302, 4]}, {"tokens": [1, 2]}, {"tokens": []}, {}]


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


async def test_the_http_routes_answer_as_llama_server(tmp_path: Path) -> None:
    """/apply-template (the GGUF's own template, through the engine), /tokenize and /detokenize: the same JSON."""
    import httpx2 as httpx

    from runtime import Runtime
    from runtime.serve.http import app as make_app

    model = write_llama(tmp_path / "tiny.gguf", n_ctx=512)
    extra = ["--no-prefill-assistant"]
    with LlamaServer(_BINARY, model, n_ctx=512, threads=1, cache_ram_mib=0, extra_args=extra) as server:
        async with Runtime.open(model, n_ctx=512, n_threads=1) as rt:
            transport = httpx.ASGITransport(app=make_app(rt))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                requests = [("/apply-template", body) for _, body in CASES]
                requests += [("/tokenize", body) for body in TOKENIZE_BODIES]
                requests += [("/detokenize", body) for body in DETOKENIZE_BODIES]
                for path, body in requests:
                    ours = await client.post(path, json=body)
                    assert ours.status_code == 200, (path, body, ours.text)
                    assert ours.json() == _post(server.url, path, body), (path, body)
