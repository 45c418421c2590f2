"""Fixtures of the slot tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.llama.engine import Engine


@pytest.fixture
def engines(
    request: pytest.FixtureRequest, make_engine: Callable[..., Engine], tiny_models: dict[str, Path]
) -> Callable[[str], Engine]:
    """Engines by architecture with the test module's `CFG` (conftest's `make_engine` closes them after the test)."""
    cfg = request.module.CFG
    return lambda arch: make_engine(tiny_models[arch], cfg)
