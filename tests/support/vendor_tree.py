"""The vendored llama.cpp tree for tests (`tests.support.vendor`: the llama-cpp-python 0.3.36 sdist, fetched
once into the ignored `.cache/`). Nothing from it is committed."""

from __future__ import annotations

from pathlib import Path

from tests.support.vendor import vendored_tree

__all__ = ["template_path", "vendored_tree"]


def template_path(name: str) -> Path:
    """The path of `models/templates/<name>` in the vendored tree."""
    return vendored_tree() / "models" / "templates" / name
