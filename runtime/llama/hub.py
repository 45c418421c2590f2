"""A GGUF from a Hugging Face repository, as llama-server's `-hf ORG/REPO[:QUANT]` and `--hf-file NAME` fetch
one: the file is chosen by its quantization tag with llama.cpp's rule (`common/download.cpp`
`find_best_model`), downloaded with `huggingface_hub` (the `hub` extra) into the hub's own cache, which brings
`HF_TOKEN`, `HF_ENDPOINT`, `HF_HUB_OFFLINE`, resumed downloads and a progress bar on a terminal.

The choice (`parse_repo`, `pick_file`, `split_parts`) is pure; `download` does the I/O. Online, the repository's
file list comes from the hub; offline (`HF_HUB_OFFLINE=1`), or when the hub cannot be reached, from what the
cache holds, as llama-server falls back to its cache.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import InvalidConfig, ModelLoadError
from runtime.log import get_logger

__all__ = ["DEFAULT_TAGS", "HubSource", "download", "parse_repo", "pick_file", "split_parts"]

log = get_logger(__name__)

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
"""The quantizations tried, in order, when `-hf` names none (then the first model file of the repository)."""

INSTALL_HINT = "pip install 'llama-turnstile[hub]'"

_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+")
_TAG = re.compile(r"[A-Za-z0-9_]+")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # sidecar files, never the model


@dataclass(frozen=True)
class HubSource:
    """Where a model comes from on the hub: a repository, and a quantization tag or a file name (or neither)."""

    repo: str
    tag: str = ""
    file: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}" if self.tag else self.repo


def parse_repo(spec: str, file: str | None = None) -> HubSource:
    """`ORG/REPO[:QUANT]` (and `--hf-file`), checked: `InvalidConfig` for anything else."""
    if not isinstance(spec, str):
        raise InvalidConfig(f"hf must be a string 'ORG/REPO[:QUANT]', not {spec!r}")
    repo, _, tag = spec.partition(":")
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise InvalidConfig(f"hf {spec!r}: expected ORG/REPO[:QUANT], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M")
    if tag and not _TAG.fullmatch(tag):
        raise InvalidConfig(f"hf {spec!r}: the quantization tag must be letters, digits and _ (e.g. Q4_K_M)")
    if file is not None and (not isinstance(file, str) or not file.endswith(".gguf") or ".." in file.split("/")):
        raise InvalidConfig(f"hf_file must name a .gguf file in the repository, not {file!r}")
    return HubSource(repo, tag, file)


def _split_info(path: str) -> tuple[str, str, int, int] | None:
    """(prefix with tag, TAG, index, count) of a .gguf name (llama.cpp's `get_gguf_split_info`), None otherwise."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[: -len(".gguf")], 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m[1], int(m[2]), int(m[3])
    t = re.search(r"[-.]([A-Z0-9_]+)$", prefix, re.IGNORECASE)
    return prefix, (t[1].upper() if t else ""), index, count


def _is_model(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in _NOT_MODELS)


def _first_part(path: str) -> bool:
    info = _split_info(path)
    return info is not None and (info[3] <= 1 or info[2] == 1)


def pick_file(files: Sequence[str], tag: str = "") -> str | None:
    """The model file llama-server's `-hf REPO[:TAG]` takes: the first model GGUF whose name has TAG followed by
    "." or "-" (any case); without a tag Q4_K_M, then Q8_0, then the first model GGUF. Of a split model, the
    first part. None when nothing fits."""
    for t in [tag] if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + "[.-]", re.IGNORECASE)
        for f in files:
            if _is_model(f) and pattern.search(f) and _first_part(f):
                return f
    if not tag:
        for f in files:
            if _is_model(f) and _first_part(f):
                return f
    return None


def split_parts(files: Sequence[str], first: str) -> list[str]:
    """Every part of the split model that `first` starts (just `first` when it is one file), in order."""
    info = _split_info(first)
    if info is None or info[3] <= 1:
        return [first]
    parts = [f for f in files if (i := _split_info(f)) is not None and (i[0], i[3]) == (info[0], info[3])]
    return sorted(parts, key=lambda f: _split_info(f)[2])  # type: ignore[index]


def _hub() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants  # submodules: the package loads its names lazily
        import huggingface_hub.errors
    except ImportError:
        raise ModelLoadError("-hf", f"downloading a model needs huggingface_hub: {INSTALL_HINT}") from None
    return huggingface_hub


def _cached_files(hub: Any, repo: str) -> list[str]:
    """The files of `repo` that the hub's cache holds (its `main` snapshot), [] if none."""
    try:
        folder = Path(hub.snapshot_download(repo, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError and friends: nothing cached
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _repo_files(hub: Any, source: HubSource) -> tuple[list[str], str]:
    """(the repository's files, "" when they came from the hub, else why they came from the cache)."""
    errors = hub.errors
    if hub.constants.HF_HUB_OFFLINE:
        return _cached_files(hub, source.repo), "HF_HUB_OFFLINE is set"
    try:
        return list(hub.list_repo_files(source.repo)), ""
    except errors.GatedRepoError:
        raise ModelLoadError(f"hf:{source}", "the repository is gated: accept its terms and set HF_TOKEN") from None
    except errors.RepositoryNotFoundError:
        raise ModelLoadError(f"hf:{source}", "no such repository on the hub (a private one needs HF_TOKEN)") from None
    except Exception as e:  # the hub is unreachable (httpx's errors, after the client's retries) or failing
        log.warning("hub.unreachable", repo=source.repo, error=str(e).splitlines()[0][:200])
        return _cached_files(hub, source.repo), "the hub could not be reached"


def download(source: HubSource) -> Path:
    """The local path of the model `source` names, downloaded into the hub's cache if it is not there yet
    (all parts of a split model; the path of the first). `ModelLoadError` when the repository, the file or
    the network fails; blocking."""
    hub = _hub()
    files, cached = _repo_files(hub, source)
    online = not cached
    if not files:
        where = f"the hub cache has no copy of it and {cached}" if cached else "the repository holds no files"
        raise ModelLoadError(f"hf:{source}", f"no GGUF to load: {where}")
    if source.file is not None:
        chosen = source.file if source.file in files else None
        missing = f"no file {source.file!r} in the repository"
    else:
        chosen = pick_file(files, source.tag)
        missing = f"no model GGUF{' tagged ' + source.tag if source.tag else ''} in the repository"
    if chosen is None:
        ggufs = [f for f in files if f.endswith(".gguf")]
        raise ModelLoadError(f"hf:{source}", f"{missing}; its GGUF files: {', '.join(ggufs) or 'none'}")
    paths: list[Path] = []
    for name in split_parts(files, chosen):
        log.info("hub.download", repo=source.repo, file=name, online=online)
        try:
            paths.append(Path(hub.hf_hub_download(source.repo, name, local_files_only=not online)))
        except hub.errors.LocalEntryNotFoundError:
            raise ModelLoadError(f"hf:{source}", f"{name} is not in the hub cache and {cached}") from None
        except (hub.errors.HfHubHTTPError, OSError) as e:
            raise ModelLoadError(f"hf:{source}", f"downloading {name} failed: {str(e).splitlines()[0]}") from None
    log.info("hub.ready", repo=source.repo, file=chosen, path=str(paths[0]))
    return paths[0]
