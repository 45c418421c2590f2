"""The llama.cpp source tree that llama-cpp-python 0.3.36 vendors, fetched once into a cache (stdlib only).

    tree = vendored_tree()             # <cache>/src/vendor/llama.cpp
    text = vendored_template("Qwen-Qwen2.5-7B-Instruct.jinja")

The oracle tests compare turnstile with a llama-server built from this tree (the same kernels as the
llama-cpp-python turnstile runs on), and tests read third-party chat templates from its
`models/templates/` instead of keeping copies in the repository.

The sdist comes from `python -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`
(pip has it cached when the install built llama-cpp-python from source) and is unpacked with tarfile's
"data" filter (no absolute paths, no links out of the tree, no device files). The cache directory is
`<repo>/.cache/llama-cpp-python-0.3.36/` (ignored by git), or `$TURNSTILE_VENDOR_CACHE` when set, or
`~/.cache/turnstile/llama-cpp-python-0.3.36/` when this module is not in a checkout. Every step is
idempotent and safe when two processes run it at once: the sdist is downloaded into a private temporary
directory and moved into place with one rename, and the archive is unpacked into a private temporary
directory that is renamed to `<cache>/src` in one step, so `<cache>/src` is either absent or complete.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from runtime.errors import TurnstileError

__all__ = [
    "CACHE_ENV",
    "LLAMA_CPP_PYTHON_VERSION",
    "VendorError",
    "default_cache_dir",
    "vendored_template",
    "vendored_tree",
]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CACHE_ENV = "TURNSTILE_VENDOR_CACHE"

_PACKAGE = "llama-cpp-python"
_REPO = Path(__file__).resolve().parents[2]
_PIP_TIMEOUT_S = 1800.0


class VendorError(TurnstileError, RuntimeError):
    """The llama-cpp-python sdist could not be downloaded or does not hold the expected llama.cpp tree."""


def default_cache_dir() -> Path:
    """Where the sdist and its unpacked tree live unless a `cache_dir` is given (see the module docstring)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    name = f"{_PACKAGE}-{LLAMA_CPP_PYTHON_VERSION}"
    if (_REPO / "pyproject.toml").is_file():
        return _REPO / ".cache" / name
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "turnstile" / name


def vendored_tree(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The `vendor/llama.cpp` directory of the llama-cpp-python 0.3.36 sdist, fetched and unpacked on first use.

    Raises `VendorError` when pip cannot download the sdist or the archive has no llama.cpp tree.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    src = cache / "src"
    if not src.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        _unpack(_sdist(cache), src)
    tree = src / "vendor" / "llama.cpp"
    if not (tree / "CMakeLists.txt").is_file():
        raise VendorError(f"{src} holds no vendor/llama.cpp tree; remove {cache} to fetch it again")
    return tree


def vendored_template(name: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The text of the chat template `models/templates/<name>` in the vendored llama.cpp tree.

    `name` is a file name (`"Qwen-Qwen2.5-7B-Instruct.jinja"`), not a path; a missing template raises
    FileNotFoundError.
    """
    if not name or name != Path(name).name or name in (".", ".."):
        raise ValueError(f"a template is named by its file name, not {name!r}")
    path = vendored_tree(cache_dir) / "models" / "templates" / name
    return path.read_text(encoding="utf-8")


def _find_sdist(directory: Path) -> Path | None:
    """The sdist archive in `directory`, whichever spelling of the project name pip saved it under."""
    for stem in ("llama_cpp_python", "llama-cpp-python"):
        path = directory / f"{stem}-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
        if path.is_file():
            return path
    return None


def _sdist(cache: Path) -> Path:
    """The sdist in `cache`, downloaded with pip (into a private directory, then renamed) if it is not there."""
    found = _find_sdist(cache)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{_PACKAGE}=={LLAMA_CPP_PYTHON_VERSION}",
            "-d",
            tmp,
        ]
        try:
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise VendorError(f"{' '.join(cmd)} failed: {e}") from e
        got = _find_sdist(Path(tmp))
        if done.returncode != 0 or got is None:
            tail = (done.stdout + done.stderr)[-4000:]
            raise VendorError(f"{' '.join(cmd)} exited with {done.returncode} and no sdist:\n{tail}")
        target = cache / got.name
        os.replace(got, target)  # atomic; a concurrent download replaces it with the same bytes
    return target


def _unpack(sdist: Path, src: Path) -> None:
    """Unpack `sdist` (one top-level directory) so that it becomes `src`, atomically; a no-op if `src` exists."""
    tmp = Path(tempfile.mkdtemp(dir=src.parent, prefix=".extract-"))
    try:
        try:
            with tarfile.open(sdist, "r:gz") as tar:
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise VendorError(f"cannot unpack {sdist}: {e}; remove it to download it again") from e
        tops = [p for p in tmp.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise VendorError(f"{sdist} does not unpack to one directory: {sorted(p.name for p in tops)}")
        try:
            os.rename(tops[0], src)
        except OSError:
            if not src.is_dir():  # not a lost race with another process: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
