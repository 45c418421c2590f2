"""The session Structs: defaults, validation, and the OpenAI message shape."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sessions import (
    InvalidSampling,
    InvalidSession,
    InvalidSessionId,
    Message,
    Sampling,
    Session,
    TurnstileError,
    check_session_id,
)
from sessions.model import validate

NAN, INF = float("nan"), float("inf")

# (field, value) pairs that Sampling must refuse, naming `field`.
BAD_SAMPLING: list[tuple[str, Any]] = [
    ("ignore_eos", 1),
    ("ignore_eos", "yes"),
    ("temperature", -0.1),
    ("temperature", NAN),
    ("temperature", INF),
    ("temperature", "0.5"),
    ("temperature", None),
    ("temperature", True),
    ("top_k", -1),
    ("top_k", 1.5),
    ("top_k", True),
    ("top_k", None),
    ("top_p", 0.0),
    ("top_p", 1.0001),
    ("top_p", NAN),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("repeat_penalty", 0.0),
    ("repeat_penalty", -1.0),
    ("repeat_penalty", -INF),
    ("repeat_last_n", -2),
    ("repeat_last_n", 64.0),
    ("presence_penalty", 2.01),
    ("presence_penalty", -2.5),
    ("frequency_penalty", 3),
    ("frequency_penalty", NAN),
    ("seed", -1),
    ("seed", 2**32),
    ("seed", 1.0),
    ("seed", "42"),
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("max_tokens", 2.0),
    ("stop", ("",)),
    ("stop", tuple("abcdefghijklmnopq")),
    ("stop", "END"),
    ("stop", (1,)),
    ("stop", None),
    ("temp", 0.5),
    ("speculative", "ngram-map-k"),
    ("speculative", True),
    ("speculative", ""),
]

BAD_IDS: list[Any] = [
    "",
    "a" * 129,
    "has space",
    "slash/x",
    "back\\slash",
    "tab\t",
    "line\n",
    "é",
    "a#b",
    "semi;colon",
    None,
    42,
    b"bytes",
]


def test_sampling_defaults_are_llama_servers() -> None:
    s = Sampling()
    assert msgspec.structs.asdict(s) == {
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "repeat_penalty": 1.0,
        "repeat_last_n": 64,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": None,
        "max_tokens": None,
        "stop": (),
        "ignore_eos": False,
        # a thinking model's controls: None inherits the runtime's
        "reasoning": None,
        "reasoning_budget": None,
        "reasoning_budget_message": None,
        "chat_template_kwargs": None,
        "reasoning_format": None,
        "speculative": None,  # n-gram speculation ("ngram" | "none"): None inherits the runtime's
    }


def test_sampling_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Sampling().temperature = 0.1  # type: ignore[misc]


def test_with_overrides_validates_and_normalises() -> None:
    s = Sampling().with_overrides(temperature=0, top_k=0, seed=2**32 - 1, max_tokens=1, stop=["</s>", "\n\n"])
    assert s == Sampling(temperature=0.0, top_k=0, seed=2**32 - 1, max_tokens=1, stop=("</s>", "\n\n"))
    assert type(s.temperature) is float
    assert Sampling().with_overrides() == Sampling()
    edge = Sampling().with_overrides(
        top_p=1, min_p=0, presence_penalty=-2, frequency_penalty=2, repeat_last_n=-1, seed=0
    )
    assert (edge.top_p, edge.min_p, edge.presence_penalty, edge.frequency_penalty) == (1.0, 0.0, -2.0, 2.0)
    assert Sampling().with_overrides(stop=tuple(str(i) for i in range(16))).stop == tuple(str(i) for i in range(16))


@pytest.mark.parametrize(("field", "value"), BAD_SAMPLING)
def test_bad_sampling_is_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidSampling) as info:
        Sampling().with_overrides(**{field: value})
    assert info.value.field == field
    assert isinstance(info.value, TurnstileError)
    assert str(info.value).startswith(f"invalid sampling {field}=")
    if field != "temp":
        with pytest.raises(InvalidSampling) as info:
            Sampling(**{field: value})
        assert info.value.field == field


def test_sampling_from_mapping() -> None:
    assert Sampling.from_mapping({"temperature": 0}) == Sampling(temperature=0.0)
    with pytest.raises(InvalidSampling) as info:
        Sampling.from_mapping([("temperature", 0)])  # type: ignore[arg-type]
    assert info.value.field == "sampling"


def test_decoding_bad_sampling_raises_the_typed_error() -> None:
    # InvalidSampling is a ValueError (bad input), which msgspec wraps in its ValidationError when it decodes;
    # the typed error is the cause
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.json.decode(b'{"top_p": 0}', type=Sampling)
    assert isinstance(info.value.__cause__, InvalidSampling)
    assert info.value.__cause__.field == "top_p"
    with pytest.raises(InvalidSampling) as built:
        Sampling(top_p=0)
    assert built.value.field == "top_p"


def test_message_defaults_and_checks() -> None:
    m = Message("user", "hi", 5.0)
    assert (m.role, m.content, m.created) == ("user", "hi", 5.0)
    assert not math.isnan(Message("assistant", "x").created)
    with pytest.raises(AttributeError):
        m.content = "changed"  # type: ignore[misc]
    bad_messages: list[tuple[Any, Any, Any]] = [
        ("tool", "x", 1.0),
        ("user", 3, 1.0),
        ("user", "x", NAN),
        ("user", "x", "now"),
    ]
    for bad in bad_messages:
        with pytest.raises(InvalidSession):
            Message(*bad)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_session_ids(bad: Any) -> None:
    with pytest.raises(InvalidSessionId) as info:
        check_session_id(bad)
    assert info.value.session_id == bad
    with pytest.raises(InvalidSessionId):
        Session(id=bad, created=1.0, updated=1.0)


@pytest.mark.parametrize("good", ["a", "a" * 128, "A-z_0.9:x@y", "agent:planner@run-7.v2"])
def test_good_session_ids(good: str) -> None:
    assert check_session_id(good) == good


def test_session_chat_messages() -> None:
    msgs = (Message("user", "hi", 1.0), Message("assistant", "hello", 2.0))
    s = Session(id="s", system="be brief", messages=msgs, created=1.0, updated=2.0)
    assert s.chat_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    no_system = msgspec.structs.replace(s, system=None)
    assert no_system.chat_messages() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]


def test_session_new() -> None:
    s = Session.new("s", system="sys", sampling={"seed": 7}, metadata={"k": [1, "v"]}, now=9.5)
    assert s == Session(
        id="s",
        system="sys",
        sampling=Sampling(seed=7),
        metadata={"k": [1, "v"]},
        created=9.5,
        updated=9.5,
        revision=0,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"messages": (Message("system", "x", 1.0),)},
        {"messages": [Message("user", "x", 1.0)]},
        {"messages": ("hi",)},
        {"system": 5},
        {"sampling": {"temperature": 0.1}},
        {"metadata": {"t": (1, 2)}},
        {"metadata": {1: "int key"}},
        {"metadata": {"x": NAN}},
        {"metadata": {"x": 2**64}},
        {"metadata": {"x": {"deep": [object()]}}},
        {"metadata": []},
        {"created": INF},
        {"revision": -1},
        {"revision": 1.0},
    ],
)
def test_session_refuses_bad_values(kwargs: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"id": "s", "created": 1.0, "updated": 1.0, **kwargs}
    with pytest.raises(InvalidSession):
        Session(**fields)


def test_validate_catches_metadata_changed_in_place() -> None:
    s = Session(id="s", created=1.0, updated=1.0)
    assert validate(s) is s
    s.metadata["t"] = (1,)
    with pytest.raises(InvalidSession):
        validate(s)


def test_sessions_imports_nothing_of_llama_cpp_runtime_or_caches() -> None:
    code = (
        "import sys, sessions; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('runtime', 'caches', 'llama_cpp')); "
        "assert bad == ['runtime', 'runtime.errors', 'runtime.log'], bad"  # the leaves every package uses
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)
