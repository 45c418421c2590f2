"""The README is a front door and the docs hold the rest: every relative link in README.md, CHANGELOG.md and
docs/ points at a file that exists, every Python block there compiles, and the README's API example (a whole
program) runs on the default model."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(page: Path, lang: str) -> list[tuple[int, str]]:
    text = page.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in BLOCK.finditer(text) if m.group(1) == lang]


def test_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    missing = []
    for m in LINK.finditer(page.read_text()):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert missing == []


def test_readme_links_every_doc_page() -> None:
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"docs/{p.name}" not in readme]
    assert unlinked == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_compile(page: Path) -> None:
    for line, code in _blocks(page, "python"):
        try:
            compile(code, f"{page.name}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as e:  # pragma: no cover - the assertion names the block
            pytest.fail(f"{page.name} line {line}: {e}")


@pytest.mark.slow
def test_readme_api_example_runs(tmp_path: Path) -> None:
    """The first Python block of the README is a whole program (`anyio.run(main)`): it runs as written."""
    line, code = _blocks(ROOT / "README.md", "python")[0]
    assert "anyio.run(main)" in code, f"README line {line} is no longer the whole-program example"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    assert any(line.startswith("ada ") for line in out) and any(line.startswith("bob ") for line in out)
    assert (tmp_path / "state").is_dir()
