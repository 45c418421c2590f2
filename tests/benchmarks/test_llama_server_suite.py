"""llama.cpp's own server test suite (tools/server/tests/unit in the vendored tree) against `turnstile serve`:
the files CI runs, through the shim that maps llama-server's command line (benchmarks.llama_server_suite),
each test that passed when the expected set was recorded must still pass.

The expected set is tests/data/llama_server_suite_expected.txt (node ids, one a line), written by
`python -m benchmarks llama-server-suite --systems turnstile --files ... --write-expected PATH`. A test that
passes now and is not in the set is reported, not failed (record it with the command above). The whole
differential against llama-server is `make compat`. Needs the vendored tree (fetched as the oracle build
fetches it) and the suite's client packages (the `compat` extra).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.llama_server_suite.run import CI_FILES, run_suite

EXPECTED = Path(__file__).resolve().parents[1] / "data" / "llama_server_suite_expected.txt"

pytestmark = [pytest.mark.slow]


def expected() -> set[str]:
    return {line.strip() for line in EXPECTED.read_text().splitlines() if line.strip() and not line.startswith("#")}


def test_suite_files_pass_on_turnstile(tmp_path: Path) -> None:
    want = expected()
    run = run_suite("turnstile", list(CI_FILES), tmp_path)
    passed = {n for n, o in run.outcomes.items() if o.outcome == "passed"}
    assert run.outcomes, f"the suite ran no test (see {run.log}):\n{run.log.read_text()[-3000:]}"
    lost = sorted(want - passed)
    new = sorted(passed - want)
    if new:
        print(f"{len(new)} tests pass that the expected set does not list:\n  " + "\n  ".join(new))
    detail = "\n".join(
        f"  {n}: {run.outcomes[n].outcome} {run.outcomes[n].reason}" if n in run.outcomes else f"  {n}: not run"
        for n in lost
    )
    assert not lost, f"{len(lost)} of {len(want)} expected tests no longer pass ({run.seconds:.0f} s):\n{detail}"
