"""The vendored llama.cpp tree for tests: `runtime.testing.vendor.vendored_tree` when that module exists, else
the same download (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`) unpacked into the
same ignored cache directory (`<repo>/.cache/llama-cpp-python-0.3.36/src`). Nothing from it is committed.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

_VERSION = "0.3.36"
_CACHE = Path(__file__).resolve().parents[1] / ".cache" / f"llama-cpp-python-{_VERSION}"


def vendored_tree() -> Path:
    """The `vendor/llama.cpp` directory of the llama-cpp-python 0.3.36 sdist (fetched once)."""
    try:
        vendor = importlib.import_module("runtime.testing.vendor")
    except ImportError:
        return _fallback()
    return Path(vendor.vendored_tree())


def _fallback() -> Path:
    src = _CACHE / "src"
    if not src.is_dir():
        _CACHE.mkdir(parents=True, exist_ok=True)
        sdists = sorted(_CACHE.glob("llama*cpp*python-*.tar.gz"))
        if not sdists:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
            subprocess.run([*cmd, f"llama-cpp-python=={_VERSION}", "-d", str(_CACHE)], check=True)
            sdists = sorted(_CACHE.glob("llama*cpp*python-*.tar.gz"))
        tmp = Path(tempfile.mkdtemp(dir=_CACHE, prefix=".extract-"))
        with tarfile.open(sdists[0], "r:gz") as tar:
            tar.extractall(tmp, filter="data")
        (top,) = [p for p in tmp.iterdir() if p.is_dir()]
        top.rename(src)
        tmp.rmdir()
    return src / "vendor" / "llama.cpp"


def template_path(name: str) -> Path:
    """The path of `models/templates/<name>` in the vendored tree."""
    return vendored_tree() / "models" / "templates" / name
