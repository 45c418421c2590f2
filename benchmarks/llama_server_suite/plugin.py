"""A pytest plugin loaded into the suite's run (`-p benchmarks.llama_server_suite.plugin`).

- `ServerPreset.load_all` (the suite's session fixture starts every preset once to download its model)
  becomes a no-op: nothing is downloaded here, and a preset with no local substitute would otherwise fail
  the whole session instead of only its own tests.
- Each test's outcome (passed, failed, skipped, error) goes to the JSON file $TURNSTILE_SUITE_RESULTS,
  keyed by node id, with the first line of a failure's message and its seconds (setup, call, teardown).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_results: dict[str, dict[str, Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    try:
        import utils  # type: ignore[import-not-found]  # the suite's tests/utils.py: the run's cwd is the suite's tests directory
    except ImportError:
        return
    utils.ServerPreset.load_all = staticmethod(lambda: None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "reason": "", "seconds": 0.0})
    entry["seconds"] = round(entry["seconds"] + report.duration, 3)  # setup (the server's start) and call
    if report.when == "call":
        entry["outcome"] = report.outcome
    elif report.failed:  # setup or teardown
        if entry["outcome"] != "failed":
            entry["outcome"] = "error"
    elif report.skipped:
        entry["outcome"] = "skipped"
    else:
        return
    if (report.failed or report.skipped) and not entry["reason"]:
        entry["reason"] = _reason(report)


def _reason(report: pytest.TestReport) -> str:
    crash: Any = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:300] if str(crash.message) else ""
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:300]
    return str(report.longrepr).splitlines()[-1][:300] if report.longrepr else ""


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("TURNSTILE_SUITE_RESULTS")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_results, f, indent=1, sort_keys=True)
