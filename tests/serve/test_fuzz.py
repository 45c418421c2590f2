"""/openapi.json and Schemathesis against it on a live `turnstile serve` (the scripted backend, then SmolLM2 for
a short run): every operation fuzzed with a bounded number of examples (positive and negative data) and the
stateful phase following the document's links, checked for no 5xx, statuses the document names, and bodies
in the declared shapes (every 4xx in its dialect's error shape: OpenAI's, or Anthropic's on /v1/messages).
It runs as key alice while key bob holds a session and a stored response: bob's data must come out unchanged.
Then a stateful run on the linked operations alone must follow the links that make state: a session created,
a turn in it, its history, undo and delete; a response continued by `previous_response_id`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx
import msgspec
import pytest

from runtime.serve.http import app as make_app
from runtime.serve.http.chat.schema import ChatRequest
from runtime.serve.http.openapi import document
from tests.support.process import ServeProcess

ALICE, BOB = "sk-fuzz-alice-1", "sk-fuzz-bob-2"
CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance"


def test_document_is_written_from_the_request_types() -> None:
    served = {(r.path, m) for r in make_app(None).routes for m in (getattr(r, "methods", None) or ()) if m != "HEAD"}
    doc = document(ChatRequest, sorted(served))
    schemas = doc["components"]["schemas"]
    assert {"ChatRequest", "MessagesRequest", "CountRequest", "ResponsesRequest", "ErrorResponse"} <= set(schemas)
    assert set(schemas["ChatRequest"]["properties"]) == set(ChatRequest.__struct_encode_fields__)
    ops = {(p, m.upper()) for p, item in doc["paths"].items() for m in item if m != "parameters"}
    assert ops == served  # every route the app serves, and no other
    described = {
        (p, m.upper()) for p, item in document(ChatRequest)["paths"].items() for m in item if m != "parameters"
    }
    assert len(described) == 20 and described <= served  # the dialects' and turnstile's own, from their types
    post = doc["paths"]["/v1/messages"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MessagesRequest"
    }
    assert post["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicError"
    }
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["responses"]["429"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"
    }
    msgspec.json.encode(doc)  # JSON-able as served


def _schemathesis(url: str, examples: int, report: Path, extra: list[str]) -> dict[str, Any]:
    exe = Path(sys.executable).with_name("schemathesis")
    args = [
        str(exe),
        "run",
        f"{url}/openapi.json",
        "-H",
        f"Authorization: Bearer {ALICE}",
        # the document offers both schemes: without this header Schemathesis sends a random x-api-key, which the
        # server checks first, so most requests were a 401 and hardly any reached the endpoint (or made state)
        "-H",
        f"x-api-key: {ALICE}",
        "--max-examples",
        str(examples),
        "--checks",
        CHECKS,
        "--phases",
        "examples,fuzzing,stateful",
        "--seed",
        "1",
        "--workers",
        "1",
        "--no-color",
        "--generation-database",
        "none",
        "--request-timeout",
        "120",
        "--report",
        "ndjson",
        "--report-dir",
        str(report),
        # POST /props, /slots/{id}, /infill, the embeddings and rerank routes answer 501 as llama-server does with
        # the feature off (a documented refusal,
        # runtime.serve.http.llama.routes), which not_a_server_error would count as a 5xx
        "--exclude-path-regex",
        r"^/(props|slots/\{id_slot\}|infill|embeddings?|v1/embeddings|(v1/)?rerank(ing)?)$",
        *extra,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False, cwd=report.parent)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    tail = done.stdout[done.stdout.rfind("Test cases:") :]
    links = re.search(r"API Links:\s+(\d+) covered / (\d+) selected", done.stdout)
    return {
        "summary": tail.splitlines()[1].strip() if "Test cases:" in done.stdout else "",
        "links": f"{links[1]} of {links[2]} links covered" if links else "",
        "applied": _applied(report),
        "stdout": done.stdout,
    }


def _applied(report: Path) -> set[str]:
    """The links the stateful phase followed (from its NDJSON report): "SOURCE -> [STATUS] NAME -> TARGET"."""
    out: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            transition = node.get("transition")
            if node.get("is_transition_applied") is True and isinstance(transition, dict):
                out.add(str(transition.get("id")))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in report.glob("*.ndjson"):
        for line in path.read_text().splitlines():
            walk(json.loads(line))
    return out


BOB_H = {"Authorization": f"Bearer {BOB}"}


async def _seed_bob(url: str) -> str:
    """Bob's session `bobs` and one stored response (its id), made before the run."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        chat = {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}
        r = await c.post("/v1/chat/completions", json=chat, headers=BOB_H | {"X-Session-Id": "bobs"})
        assert r.status_code == 200, r.text
        r = await c.post("/v1/responses", json={"input": "Hi.", "max_output_tokens": 4}, headers=BOB_H)
        assert r.status_code == 200, r.text
        return str(r.json()["id"])


async def _bobs(url: str, response_id: str) -> list[Any]:
    """What bob holds: his session list, the session, the response and its input items."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        paths = ["/v1/sessions", "/v1/sessions/bobs", f"/v1/responses/{response_id}"]
        paths.append(f"/v1/responses/{response_id}/input_items")
        out = []
        for path in paths:
            r = await c.get(path, headers=BOB_H)
            assert r.status_code == 200, (path, r.text)
            out.append(r.json())
        return out


# the real model: only the three dialects' turns, fuzzed (the rest is the same code on either backend)
TURNS_ONLY = ["--include-path-regex", "^/v1/(chat/completions|messages|responses)$", "--phases", "fuzzing"]
# the stateful phase alone on the operations each family of links joins (later options win over _schemathesis' own):
# with every operation in one run, 10 scenarios seldom start where the links begin
LINKED = [
    ["--include-path-regex", "^/v1/(sessions|chat/completions$|messages$)", "--phases", "stateful"],
    ["--include-path-regex", "^/v1/responses", "--phases", "stateful"],
]
MUST_FOLLOW = {
    "POST /v1/sessions -> [201] ChatInSession -> POST /v1/chat/completions",
    "POST /v1/sessions -> [201] MessageInSession -> POST /v1/messages",
    "POST /v1/sessions -> [201] DeleteSession -> DELETE /v1/sessions/{session_id}",
    "POST /v1/responses -> [200] ContinueResponse -> POST /v1/responses",
    "POST /v1/responses -> [200] GetResponse -> GET /v1/responses/{response_id}",
}


@pytest.mark.parametrize(("backend", "examples", "extra"), [("scripted", 10, []), ("smollm2", 3, TURNS_ONLY)])
async def test_schemathesis_finds_no_5xx_and_no_shape_outside_the_document(
    backend: str, examples: int, extra: list[str], tmp_path: Path, smollm2_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"alice: {ALICE}\nbob: {BOB}\n")
    model = ["--scripted"] if backend == "scripted" else ["--model", smollm2_path, "--ctx", "1024", "--threads", "2"]
    # a max_tokens ceiling keeps a fuzzed request from generating a whole context on the real model
    with ServeProcess(*model, "--api-key-file", keys, "--quota", "max_tokens=8", "--data-dir", tmp_path / "d") as srv:
        response_id = await _seed_bob(srv.url)
        before = await _bobs(srv.url, response_id)
        run = _schemathesis(srv.url, examples, tmp_path / "report", extra)
        stateful_runs = LINKED if backend == "scripted" else []  # the links are the same code on either backend
        linked = [_schemathesis(srv.url, 10, tmp_path / f"linked{i}", x) for i, x in enumerate(stateful_runs)]
        after = await _bobs(srv.url, response_id)
        errors = srv.stderr()
    assert after == before  # alice's requests changed nothing of bob's
    assert "Traceback" not in errors and "serve.unexpected_error" not in errors
    print(f"schemathesis ({backend}, {examples} examples/operation): {run['summary']}; {run['links']}")
    for stateful in linked:
        print(f"schemathesis stateful on the linked operations: {stateful['summary']}; {stateful['links']}")
    if linked:
        applied = set().union(*(stateful["applied"] for stateful in linked))
        assert applied >= MUST_FOLLOW, sorted(applied)
