"""Fixtures of the web page's browser tests: one real `turnstile serve` on SmolLM2 with two API keys, the
system's Chromium driven by Playwright (no browser download), a page per test that may reach nothing but the
server's origin, and a screenshot under the test's tmp dir when a test fails.

Without Chromium or Playwright the tests skip, and fail with CI=true (`.ci/run` installs both)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.process import ServeProcess

KEYS = {"alice": "key-alice", "bob": "key-bob"}
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{what} (CI=true: .ci/run installs it)", pytrace=False)
    pytest.skip(what)


def chromium_path() -> str:
    for name in CHROMIUM:
        path = shutil.which(name)
        if path:
            return path
    _missing("no Chromium on PATH (apt-get install chromium)")
    raise AssertionError  # not reached


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("".join(f"{name}: {key}\n" for name, key in KEYS.items()))
    with ServeProcess("--threads", "1", "--ctx", "2048", "--api-key-file", keys) as srv:  # no --model: SmolLM2
        yield srv


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install 'llama-turnstile[web-test]')")
    path = chromium_path()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


class Offline:
    """Every request a browser context makes that is not to the server's origin: aborted and recorded."""

    def __init__(self, origin: str) -> None:
        self.origin = origin.rstrip("/")
        self.blocked: list[str] = []

    def handle(self, route: Any) -> None:
        url = route.request.url
        if url == self.origin or url.startswith(self.origin + "/"):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()


@pytest.fixture
def open_page(
    browser: Any, server: ServeProcess, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[str], Any]]:
    """`open_page(key_name)`: a new browser context on the page, the key entered; on failure every open
    page's screenshot goes to the test's tmp dir. At the end no request left the server's origin."""
    contexts: list[tuple[Any, Offline]] = []
    pages: list[Any] = []

    def open_(name: str) -> Any:
        offline = Offline(server.url)
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        context.route("**/*", offline.handle)
        contexts.append((context, offline))
        page = context.new_page()
        page.set_default_timeout(180_000)
        pages.append(page)
        page.goto(server.url + "/")
        page.get_by_test_id("ask-input").fill(KEYS[name])
        page.get_by_test_id("ask-ok").click()
        page.wait_for_selector("body[data-ready='1']")
        return page

    try:
        yield open_
    finally:
        if request.node.stash.get(_FAILED, False):
            for i, page in enumerate(pages):
                shot = tmp_path / f"failure-{i}.png"
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot: {shot}")
        for context, offline in contexts:
            context.close()
            assert offline.blocked == [], f"the page tried to reach beyond the server: {offline.blocked}"
