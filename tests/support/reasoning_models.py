"""Tiny GGUF models with thinking templates read from llama.cpp's `models/templates/` at test time.

The vocabulary is tests/support/tool_models.py's (every token string unique, no space prefix) plus `<think>` and
`</think>` as USER_DEFINED tokens (they detokenize to their text, as in Qwen3's tokenizer). The templates come
from the vendored llama.cpp tree of the llama-cpp-python 0.3.36 sdist (`tests.support.vendor`, fetched once
into the git-ignored `.cache/`; nothing of it is ever committed).
"""

from __future__ import annotations

from pathlib import Path

from tests.support.tiny_models import write_llama
from tests.support.tool_models import _CONTROL, _USER, QWEN_SPECIALS, _vocab
from tests.support.vendor import vendored_template

__all__ = ["HARMONY_SPECIALS", "THINK_SPECIALS", "vendored_template", "write_harmony", "write_thinking"]

THINK_SPECIALS = [*QWEN_SPECIALS, ("<think>", _USER), ("</think>", _USER)]
# gpt-oss's o200k_harmony specials, CONTROL as in its GGUF (llama.cpp renders <|channel|>, <|message|>, <|start|>
# and <|constrain|> as text anyway, and takes <|return|> and <|call|>, not <|end|>, as end-of-generation tokens)
HARMONY_SPECIALS = [
    (s, _CONTROL)
    for s in (
        "<|startoftext|>",
        "<|endoftext|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|constrain|>",
        "<|return|>",
        "<|call|>",
    )
]


def write_thinking(path: Path, template: str, *, seed: int = 21) -> Path:
    """A tiny llama with `template` (Jinja source) and `<think>` / `</think>` as single text tokens."""
    return write_llama(path, seed=seed, vocab=_vocab(THINK_SPECIALS, template, "<|endoftext|>", "<|im_end|>"))


def write_harmony(path: Path, template: str, *, seed: int = 21) -> Path:
    """A tiny llama with gpt-oss's specials as single tokens (`HARMONY_SPECIALS`) and `template`."""
    return write_llama(path, seed=seed, vocab=_vocab(HARMONY_SPECIALS, template, "<|startoftext|>", "<|return|>"))
