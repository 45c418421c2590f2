"""Tiny GGUF models with thinking templates read from llama.cpp's `models/templates/` at test time.

The vocabulary is tests/tool_models.py's (every token string unique, no space prefix) plus `<think>` and
`</think>` as USER_DEFINED tokens (they detokenize to their text, as in Qwen3's tokenizer). The templates come
from the vendored llama.cpp tree of the llama-cpp-python 0.3.36 sdist: `runtime.testing.vendor` when it is
there (the oracle branch), else the same cache layout fetched here (`<repo>/.cache/llama-cpp-python-0.3.36/`,
git-ignored; nothing of it is ever committed).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from runtime.testing.tiny_models import write_llama
from tests.tool_models import _USER, QWEN_SPECIALS, _vocab

_REPO = Path(__file__).resolve().parents[1]
_CACHE = _REPO / ".cache" / "llama-cpp-python-0.3.36"

THINK_SPECIALS = [*QWEN_SPECIALS, ("<think>", _USER), ("</think>", _USER)]


def vendored_template(name: str) -> str:
    """The text of `models/templates/<name>` in the vendored llama.cpp tree."""
    try:
        from runtime.testing.vendor import vendored_template as fetch  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return (_tree() / "models" / "templates" / name).read_text(encoding="utf-8")
    text: str = fetch(name)
    return text


def _tree() -> Path:
    src = _CACHE / "src"
    if not src.is_dir():
        _CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*cmd, "llama-cpp-python==0.3.36", "-d", str(_CACHE)], check=True, capture_output=True)
        sdist = next(_CACHE.glob("llama*cpp*python-0.3.36.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(_CACHE / "extract", filter="data")
        next((_CACHE / "extract").iterdir()).rename(src)
    return src / "vendor" / "llama.cpp"


def write_thinking(path: Path, template: str, *, seed: int = 21) -> Path:
    """A tiny llama with `template` (Jinja source) and `<think>` / `</think>` as single text tokens."""
    return write_llama(path, seed=seed, vocab=_vocab(THINK_SPECIALS, template, "<|endoftext|>", "<|im_end|>"))
