"""`text.format` on /v1/responses against a real `turnstile serve` (SmolLM2, greedy) with the official `openai`
client: `json_schema` (strict) gives output that parses and validates (exact values: greedy decides them),
`json_object` a JSON object, `responses.parse` a pydantic model, and a schema the grammar converter refuses a
400 in OpenAI's error shape (naming `text.format.schema`), also for a stream, with nothing stored.
(llama-server's /v1/responses does not read `text.format`, so there is no oracle to compare with.)"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.support.process import ServeProcess

pytestmark = pytest.mark.slow

GEN: dict[str, Any] = {"model": "m", "temperature": 0, "max_output_tokens": 60}
ASK = "Name the biggest city of France and its population as JSON."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


class City(BaseModel):
    city: str
    population: int


@pytest.fixture(scope="module")
def oai(smollm2_path: Path) -> Iterator[tuple[OpenAI, ServeProcess]]:
    with ServeProcess("--model", smollm2_path, "--threads", "2", "--ctx", "2048") as srv:
        yield OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0), srv


def stored(srv: ServeProcess) -> int:
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(r"^turnstile_stored_responses (\d+)$", text, re.M)
    assert m is not None, text
    return int(m.group(1))


def test_json_schema_strict_output_parses_and_validates(oai: tuple[OpenAI, ServeProcess]) -> None:
    client, _ = oai
    fmt: Any = {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}
    r = client.responses.create(input=ASK, text={"format": fmt}, **GEN)
    assert r.status == "completed"
    value = json.loads(r.output_text)
    assert value == {"city": "Paris", "population": 111122223}  # greedy's answer, in the schema's key order
    assert list(value) == ["city", "population"] and isinstance(value["population"], int)
    assert r.text.format.type == "json_schema" and r.text.format.name == "city"  # echoed back
    got = client.responses.retrieve(r.id)
    assert got.output_text == r.output_text


def test_json_object_output_is_an_object(oai: tuple[OpenAI, ServeProcess]) -> None:
    client, _ = oai
    r = client.responses.create(
        input="Give me a JSON object with the name of the capital of France.",
        text={"format": {"type": "json_object"}},
        **GEN,
    )
    assert r.status == "completed"
    assert json.loads(r.output_text) == {"name": "Paris", "population": 1, "capital": "Paris"}


def test_responses_parse_with_a_pydantic_model(oai: tuple[OpenAI, ServeProcess]) -> None:
    client, _ = oai
    r = client.responses.parse(input=ASK, text_format=City, **GEN)
    assert r.output_parsed == City(city="Paris", population=111122223)


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "nonsense"}, "unrecognized type nonsense"),
        ({"type": "object", "properties": {"a": {"type": "integer", "minimum": "x"}}}, "minimum must be a number"),
        ({"$ref": "#/nowhere"}, "cannot resolve $ref"),
        ({"type": "string", "pattern": "^(($"}, "unbalanced parentheses"),
    ],
)
def test_a_bad_schema_is_a_400_and_nothing_is_stored(
    oai: tuple[OpenAI, ServeProcess], schema: dict[str, Any], why: str
) -> None:
    client, srv = oai
    before = stored(srv)
    fmt: Any = {"type": "json_schema", "name": "bad", "schema": schema, "strict": True}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(input="x", text={"format": fmt}, **GEN)
    body: Any = err.value.body
    assert (body["type"], body["param"], body["code"]) == (
        "invalid_request_error",
        "text.format.schema",
        "invalid_json_schema",
    )
    assert body["message"].startswith("Invalid schema for text.format 'bad': ") and why in body["message"]
    # refused before the stream starts
    with (
        pytest.raises(openai.BadRequestError) as streamed,
        client.responses.stream(input="x", text={"format": fmt}, **GEN) as events,
    ):
        list(events)
    assert streamed.value.status_code == 400
    assert stored(srv) == before
