"""Tiny GGUF models with thinking templates read from llama.cpp's `models/templates/` at test time.

The vocabulary is tests/tool_models.py's (every token string unique, no space prefix) plus `<think>` and
`</think>` as USER_DEFINED tokens (they detokenize to their text, as in Qwen3's tokenizer). The templates come
from the vendored llama.cpp tree of the llama-cpp-python 0.3.36 sdist (`runtime.testing.vendor`, fetched once
into the git-ignored `.cache/`; nothing of it is ever committed).
"""

from __future__ import annotations

from pathlib import Path

from runtime.testing.tiny_models import write_llama
from runtime.testing.vendor import vendored_template
from tests.tool_models import _USER, QWEN_SPECIALS, _vocab

__all__ = ["THINK_SPECIALS", "vendored_template", "write_thinking"]

THINK_SPECIALS = [*QWEN_SPECIALS, ("<think>", _USER), ("</think>", _USER)]


def write_thinking(path: Path, template: str, *, seed: int = 21) -> Path:
    """A tiny llama with `template` (Jinja source) and `<think>` / `</think>` as single text tokens."""
    return write_llama(path, seed=seed, vocab=_vocab(THINK_SPECIALS, template, "<|endoftext|>", "<|im_end|>"))
