"""Fixtures of the cache tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def models(tiny_models: dict[str, Path], smollm2_path: Path) -> dict[str, Path]:
    """Every tiny model kind and SmolLM2, by name."""
    return {**tiny_models, "smollm2": smollm2_path}
