"""Fixtures of the llama tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.llama.engine import Engine


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Iterator[Engine]:
    """An engine on SmolLM2 (default settings), one per test module."""
    eng = Engine(smollm2_path)
    yield eng
    eng.close()
