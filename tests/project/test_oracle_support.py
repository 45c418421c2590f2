"""The oracle's support code without network or compiler: the vendored-tree cache (tests.support.vendor)
on a small stand-in sdist, and the run / skip / fail decision for oracle tests (tests.support.oracle)."""

from __future__ import annotations

import io
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.oracle import ENV, in_ci, llama_server_problem, oracle_verdict
from tests.support.vendor import LLAMA_CPP_PYTHON_VERSION, VendorError, vendored_template, vendored_tree

TOP = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
SDIST = f"{TOP}.tar.gz"


def write_sdist(path: Path, files: dict[str, str]) -> Path:
    """A gzipped tar with `files` (name -> text), as an sdist holds them."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache directory that already holds a stand-in sdist (so nothing is downloaded)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    write_sdist(
        cache / SDIST,
        {
            f"{TOP}/pyproject.toml": "",
            f"{TOP}/vendor/llama.cpp/CMakeLists.txt": "project(llama.cpp)\n",
            f"{TOP}/vendor/llama.cpp/models/templates/t.jinja": "{{ messages }}\n",
        },
    )
    return cache


def test_vendored_tree_unpacks_once_and_reads_templates(cache: Path) -> None:
    tree = vendored_tree(cache)
    assert tree == cache / "src" / "vendor" / "llama.cpp"
    assert (tree / "CMakeLists.txt").read_text() == "project(llama.cpp)\n"
    (cache / SDIST).unlink()  # a second call neither needs the archive nor unpacks again
    assert vendored_tree(cache) == tree
    assert vendored_template("t.jinja", cache) == "{{ messages }}\n"
    with pytest.raises(FileNotFoundError):
        vendored_template("missing.jinja", cache)
    for bad in ("../t.jinja", "templates/t.jinja", "", ".."):
        with pytest.raises(ValueError):
            vendored_template(bad, cache)


def test_concurrent_unpacks_agree_and_leave_no_temporary_directories(cache: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        trees = list(pool.map(lambda _: vendored_tree(cache), range(4)))
    assert len(set(trees)) == 1 and (trees[0] / "CMakeLists.txt").is_file()
    assert sorted(p.name for p in cache.iterdir()) == [SDIST, "src"]


def test_the_cache_directory_comes_from_the_environment(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTILE_VENDOR_CACHE", str(cache))
    assert vendored_tree() == cache / "src" / "vendor" / "llama.cpp"


def test_an_archive_member_outside_the_tree_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    write_sdist(cache / SDIST, {f"{TOP}/vendor/llama.cpp/CMakeLists.txt": "", "../escaped.txt": "x"})
    with pytest.raises(VendorError, match="cannot unpack"):
        vendored_tree(cache)
    assert not (tmp_path / "escaped.txt").exists()
    assert not (cache / "src").exists()
    assert [p.name for p in cache.iterdir()] == [SDIST]


def test_an_archive_without_llama_cpp_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    write_sdist(cache / SDIST, {f"{TOP}/pyproject.toml": ""})
    with pytest.raises(VendorError, match=r"no vendor/llama\.cpp"):
        vendored_tree(cache)


def test_oracle_tests_run_skip_or_fail(tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    plain = tmp_path / "not-executable"
    plain.write_text("")

    assert oracle_verdict({ENV: str(exe)}).action == "run"
    assert oracle_verdict({ENV: str(exe), "CI": "true"}).action == "run"
    for env in ({}, {ENV: ""}, {ENV: str(plain)}, {ENV: str(tmp_path / "absent")}, {ENV: str(tmp_path)}):
        problem = llama_server_problem(env)
        assert problem is not None and ENV in problem
        assert oracle_verdict(env).action == "skip"
        assert oracle_verdict(env).reason == problem
        failed = oracle_verdict({**env, "CI": "true"})
        assert failed.action == "fail" and problem in failed.reason and "make oracle" in failed.reason
    assert [in_ci({"CI": v}) for v in ("true", "True", "1", "yes", "false", "0", "")] == [True] * 4 + [False] * 3
    assert not in_ci({})
