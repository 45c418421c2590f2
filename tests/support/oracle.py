"""Whether the oracle tests can run, and what to do when they cannot (stdlib only).

The oracle tests (marked `oracle`) compare turnstile with a llama-server binary named by the environment
variable TURNSTILE_LLAMA_SERVER. Without a usable binary they are skipped on a developer's machine, but
in CI (`CI=true`, as CI services set it) they must fail instead: an oracle that is silently skipped
checks nothing. The test suite's conftest turns `oracle_verdict()` into pytest's skip or fail.

`make oracle` builds the binary (.ci/build-oracle); `.ci/run` exports TURNSTILE_LLAMA_SERVER for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["ENV", "OracleVerdict", "in_ci", "llama_server_binary", "llama_server_problem", "oracle_verdict"]

ENV = "TURNSTILE_LLAMA_SERVER"


@dataclass(frozen=True)
class OracleVerdict:
    """What an oracle test does: run, skip (no binary, not CI) or fail (no binary in CI), and why."""

    action: Literal["run", "skip", "fail"]
    reason: str = ""


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def llama_server_binary(environ: Mapping[str, str] | None = None) -> str:
    """The llama-server binary TURNSTILE_LLAMA_SERVER names ("" when it is unset)."""
    return _env(environ).get(ENV, "")


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """True when the CI variable says so (`true`, `1` or `yes`, any case)."""
    return _env(environ).get("CI", "").strip().lower() in ("true", "1", "yes")


def llama_server_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why TURNSTILE_LLAMA_SERVER names no usable binary (None when it names an executable file)."""
    binary = llama_server_binary(environ)
    if not binary:
        return f"{ENV} is not set (it names a llama-server binary to compare with)"
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        return f"{ENV}={binary!r} is not an executable file"
    return None


def oracle_verdict(environ: Mapping[str, str] | None = None) -> OracleVerdict:
    """Run when the binary is usable; otherwise skip, or fail when running in CI."""
    problem = llama_server_problem(environ)
    if problem is None:
        return OracleVerdict("run")
    if in_ci(environ):
        return OracleVerdict(
            "fail",
            f"{problem}; CI=true, so the oracle tests fail instead of being skipped "
            f"(`make oracle` builds llama-server and prints its path; .ci/run exports {ENV})",
        )
    return OracleVerdict("skip", problem)
