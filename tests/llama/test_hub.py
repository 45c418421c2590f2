"""`-hf ORG/REPO[:QUANT]` / `Runtime.open(hf=...)`: llama-server's choice of file, and the real
`huggingface_hub` client downloading from a hub on loopback (`tests/support/fake_hub.py`, through HF_ENDPOINT):
the default quantization, a missing repository, an interrupted download resumed, offline mode.

huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE when it is imported, so each download runs in
a fresh interpreter with its own environment (as a user's command would).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.errors import InvalidConfig
from runtime.llama.hub import parse_repo, pick_file, split_parts
from tests.support.fake_hub import FakeHub, running_hub

pytest.importorskip("huggingface_hub", reason="the `hub` extra (in `dev`)")

ROOT = Path(__file__).resolve().parents[2]
REPO = "tiny-org/tiny-GGUF"


def test_parse_repo() -> None:
    assert parse_repo("org/repo") == parse_repo("org/repo")
    s = parse_repo("ggml-org/gemma-3-1b-it-GGUF:q8_0")
    assert (s.repo, s.tag, s.file) == ("ggml-org/gemma-3-1b-it-GGUF", "q8_0", None)
    assert parse_repo("org/repo", "sub/x-Q4_0.gguf").file == "sub/x-Q4_0.gguf"
    for bad in ("repo", "org/repo/extra", "/repo", "org/", "org/repo:Q4 K", "../x/y", "org/..:Q4"):
        with pytest.raises(InvalidConfig):
            parse_repo(bad)
    with pytest.raises(InvalidConfig, match="hf_file"):
        parse_repo("org/repo", "../../etc/passwd.gguf")
    with pytest.raises(InvalidConfig, match="hf_file"):
        parse_repo("org/repo", "README.md")


def test_pick_file_follows_llama_server() -> None:
    files = ["README.md", "m-F16.gguf", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-Q4_K_M.gguf"]
    assert pick_file(files) == "m-Q4_K_M.gguf"  # the default: Q4_K_M first
    assert pick_file([f for f in files if "Q4_K_M" not in f]) == "m-Q8_0.gguf"  # then Q8_0
    assert pick_file(["a.txt", "mmproj-x.gguf", "m-F16.gguf", "m-BF16.gguf"]) == "m-F16.gguf"  # then the first
    assert pick_file(files, "q8_0") == "m-Q8_0.gguf"  # any case
    assert pick_file(files, "Q5_K_M") is None  # a tag that is not there: nothing (no fallback)
    assert pick_file(["mmproj-m-Q8_0.gguf", "imatrix-Q8_0.gguf"], "Q8_0") is None  # sidecars are never the model
    split = ["big-Q4_K_M-00002-of-00003.gguf", "big-Q4_K_M-00001-of-00003.gguf", "big-Q4_K_M-00003-of-00003.gguf"]
    first = pick_file(["x.txt", *split])
    assert first == "big-Q4_K_M-00001-of-00003.gguf"
    assert split_parts(split, first) == sorted(split)
    assert split_parts(files, "m-Q8_0.gguf") == ["m-Q8_0.gguf"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    from tests.support.tiny_models import write_llama

    d = tmp_path_factory.mktemp("hubmodels")
    return {
        "tiny-Q8_0.gguf": write_llama(d / "a.gguf", n_ctx=512, seed=11).read_bytes(),
        "tiny-Q4_K_M.gguf": write_llama(d / "b.gguf", n_ctx=512, seed=12).read_bytes(),
        "mmproj-tiny-Q4_K_M.gguf": b"GGUF not a model",
        "README.md": b"# tiny\n",
    }


BIG = "tiny-org/big-GGUF"
CHUNK = 10 << 20  # huggingface_hub writes a download in chunks of 10 MiB: it resumes after the last whole one
BIG_FILE = b"GGUF" + bytes(range(256)) * ((CHUNK + (2 << 20)) // 256)


@pytest.fixture
def hub(models: dict[str, bytes]) -> Iterator[FakeHub]:
    with running_hub({REPO: models, BIG: {"big-Q8_0.gguf": BIG_FILE}}) as h:
        yield h


def _env(hub: FakeHub, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_PROGRESS_BARS": "1", **extra}


def _download(hub: FakeHub, home: Path, spec: str, file: str | None = None, **extra: str) -> tuple[int, str]:
    """Run `hub.download` in a fresh interpreter: (exit code, the path it printed or the error)."""
    code = textwrap.dedent(f"""
        import sys
        from runtime.errors import ModelLoadError
        from runtime.llama import hub
        try:
            print(hub.download(hub.parse_repo({spec!r}, {file!r})))
        except ModelLoadError as e:
            print(e)
            sys.exit(3)
    """)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=_env(hub, home, **extra)
    )
    assert r.returncode in (0, 3), r.stderr
    return r.returncode, r.stdout.strip()


def test_download_chooses_like_llama_server(hub: FakeHub, models: dict[str, bytes], tmp_path: Path) -> None:
    rc, out = _download(hub, tmp_path, REPO)
    assert rc == 0 and Path(out).name == "tiny-Q4_K_M.gguf"
    assert Path(out).read_bytes() == models["tiny-Q4_K_M.gguf"]
    assert str(tmp_path) in out  # the hub's own cache (HF_HOME)
    rc, out = _download(hub, tmp_path, f"{REPO}:q8_0")
    assert rc == 0 and Path(out).read_bytes() == models["tiny-Q8_0.gguf"]
    rc, out = _download(hub, tmp_path, REPO, "README.md".replace(".md", ".gguf"))
    assert rc == 3 and "no file 'README.gguf'" in out and "tiny-Q8_0.gguf" in out  # lists what there is
    rc, out = _download(hub, tmp_path, f"{REPO}:Q5_K_M")
    assert rc == 3 and "no model GGUF tagged Q5_K_M" in out


def test_missing_repository_is_a_clear_error(hub: FakeHub, tmp_path: Path) -> None:
    rc, out = _download(hub, tmp_path, "nobody/nothing-GGUF:Q4_K_M")
    assert rc == 3
    want = "no such repository on the hub (a private one needs HF_TOKEN)"
    assert out == f"cannot load model 'hf:nobody/nothing-GGUF:Q4_K_M': {want}"
    assert not hub.file_requests()


def test_interrupted_download_is_resumed(hub: FakeHub, tmp_path: Path) -> None:
    hub.cut_next = CHUNK + 12345  # the connection drops 12,345 bytes into the second chunk
    rc, out = _download(hub, tmp_path, BIG)
    assert rc == 0 and Path(out).read_bytes() == BIG_FILE
    gets = [(r.method, r.range) for r in hub.file_requests() if r.method == "GET"]
    assert gets == [("GET", None), ("GET", f"bytes={CHUNK}-")]  # the rest, not the whole file again


def test_offline_uses_the_cache_and_fetches_nothing(hub: FakeHub, models: dict[str, bytes], tmp_path: Path) -> None:
    rc, out = _download(hub, tmp_path / "empty", REPO, HF_HUB_OFFLINE="1")
    assert rc == 3 and "HF_HUB_OFFLINE" in out and not hub.requests  # nothing cached: a clear error, no request
    rc, online = _download(hub, tmp_path, f"{REPO}:Q8_0")
    assert rc == 0
    hub.requests.clear()
    rc, offline = _download(hub, tmp_path, f"{REPO}:Q8_0", HF_HUB_OFFLINE="1")
    assert rc == 0 and offline == online and Path(offline).read_bytes() == models["tiny-Q8_0.gguf"]
    assert hub.requests == []
    rc, out = _download(hub, tmp_path, REPO, HF_HUB_OFFLINE="1")  # the cache holds only Q8_0: the default finds it
    assert rc == 0 and out == online and hub.requests == []


def test_runtime_open_hf_and_the_cli(hub: FakeHub, tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import anyio
        from runtime.api import Runtime

        async def main():
            async with Runtime.open(hf={REPO + ":Q8_0"!r}, n_ctx=256, n_threads=1) as rt:
                print(rt.engine_info().model)

        anyio.run(main)
    """)
    env = _env(hub, tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tiny-Q8_0.gguf"
    c = _cli(env, "chat", "-hf", REPO, "--max-tokens", "3", "--temperature", "0", "-t", "1", "-c", "256", stdin="hi\n")
    assert c.returncode == 0, c.stderr
    assert any(r.path.endswith("/tiny-Q4_K_M.gguf") and r.method == "GET" for r in hub.file_requests())
    c = _cli(env, "chat", "-hf", "no-such")
    assert c.returncode == 2 and "ORG/REPO[:QUANT]" in c.stderr
    c = _cli(env, "serve", "--hf-file", "x.gguf")
    assert c.returncode == 2 and "--hf-file needs -hf" in c.stderr
    c = _cli(env, "demo", "-hf", "nobody/nothing")
    assert c.returncode == 2 and "no such repository on the hub" in c.stderr


def _cli(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "runtime.cli", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
