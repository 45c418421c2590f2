"""One hierarchy of errors: every error class the project defines derives from `TurnstileError`, names are
unique, every bad-input error is a `ValueError`, and each error sits under exactly one category."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import caches
import runtime
import sessions
from runtime import errors
from runtime.errors import (
    BadInput,
    BadModelOutput,
    Busy,
    Conflict,
    DataCorrupt,
    EngineError,
    NotFound,
    TimedOut,
    TurnstileError,
    Unavailable,
)

CATEGORIES = (BadInput, NotFound, Conflict, Busy, Unavailable, TimedOut, BadModelOutput, DataCorrupt, EngineError)


def _project_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in (runtime, caches, sessions):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith(".__main__"):  # runs the CLI when imported
                continue
            module = importlib.import_module(info.name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


EXCEPTIONS = _project_exceptions()


def test_the_walk_finds_the_errors() -> None:
    names = {e.__name__ for e in EXCEPTIONS}
    assert {"SessionCorrupt", "QueueFull", "ApiError", "LlamaServerError"} <= names


def test_every_public_error_derives_from_turnstile_error() -> None:
    outside = [e for e in EXCEPTIONS if not issubclass(e, TurnstileError) and not e.__name__.startswith("_")]
    assert outside == []


def test_error_names_are_unique_and_shadow_nothing() -> None:
    names = [e.__name__ for e in EXCEPTIONS]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    import msgspec

    assert not {n for n in names if hasattr(msgspec, n) or hasattr(__builtins__, n)}


def test_errors_live_in_one_module_but_for_the_http_response_and_test_harnesses() -> None:
    elsewhere = sorted(
        f"{e.__module__}.{e.__name__}"
        for e in EXCEPTIONS
        if e.__module__ != "runtime.errors" and not e.__name__.startswith("_")
    )
    assert elsewhere == [  # the slot's and the HTTP adapter's own signals and response, the test harnesses' failures
        "runtime.backend.protocol.PrefillPaused",
        "runtime.serve.http.endpoint.ClientGone",
        "runtime.serve.http.errors.ApiError",
        "tests.support.llama_server.LlamaServerError",
        "tests.support.process.ServeProcessError",
        "tests.support.vendor.VendorError",
    ]


@pytest.mark.parametrize("cls", [getattr(errors, n) for n in errors.__all__], ids=lambda c: c.__name__)
def test_each_error_has_one_category_and_a_docstring(cls: type[TurnstileError]) -> None:
    assert (cls.__doc__ and cls.__doc__.startswith("Raised")) or cls in (TurnstileError, *CATEGORIES)
    if cls is TurnstileError or cls in CATEGORIES:
        return
    assert sum(issubclass(cls, c) for c in CATEGORIES) == 1, cls.__mro__


def test_every_bad_input_error_is_a_value_error() -> None:
    bad = [getattr(errors, n) for n in errors.__all__ if issubclass(getattr(errors, n), BadInput)]
    assert len(bad) >= 12
    assert all(issubclass(c, ValueError) for c in bad)
