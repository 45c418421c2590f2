"""`python -m benchmarks llama-server-suite`: llama.cpp's own server test suite against llama-server and
against `turnstile serve`, with the same local models (`models.py`: the substitution table), through a shim
that maps llama-server's command line onto turnstile's (`shim.py`; a flag it cannot map fails the test).

Prints per file: tests, passed on llama-server, passed on turnstile, passed on both; writes the table as
JSON (bench-results/llama-server-suite.json) and every test's outcome on each system beside it
(llama-server-suite.tests.json), then lists the tests that pass on llama-server but not on turnstile.

    python -m benchmarks llama-server-suite                       # both systems, the default files
    python -m benchmarks llama-server-suite --systems turnstile --files test_tokenize test_template
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks._cli import out_path, progress
from benchmarks._report import RESULTS_DIR, emit
from benchmarks.llama_server_suite.run import FILES, SuiteRun, run_suite

NAME = "llama-server-suite"
SYSTEMS = ("llama-server", "turnstile")


def _file_of(node: str) -> str:
    return node.split("::", 1)[0].removeprefix("unit/").removesuffix(".py")


def rows(runs: dict[str, SuiteRun], files: list[str]) -> list[dict[str, object]]:
    """One row per file (and a total): tests, passed on each system, passed on both."""
    nodes: dict[str, set[str]] = defaultdict(set)
    for r in runs.values():
        for node in r.outcomes:
            nodes[_file_of(node)].add(node)
    out: list[dict[str, object]] = []
    for f in [*files, "total"]:
        names = set().union(*nodes.values()) if f == "total" else nodes.get(f, set())
        row: dict[str, object] = {"file": f, "tests": len(names)}
        passed = {
            s: {n for n in names if r.outcomes.get(n) and r.outcomes[n].outcome == "passed"} for s, r in runs.items()
        }
        for s in runs:
            row[s] = len(passed[s])
        if len(runs) == 2:
            row["both"] = len(set.intersection(*passed.values()))
        for s, r in runs.items():
            row[f"{s} s"] = round(sum(r.outcomes[n].seconds for n in names if n in r.outcomes))
        out.append(row)
    return out


def gaps(runs: dict[str, SuiteRun]) -> list[tuple[str, str]]:
    """(node id, turnstile's reason) for the tests that pass on llama-server and not on turnstile."""
    if set(runs) != set(SYSTEMS):
        return []
    ls, ts = runs["llama-server"].outcomes, runs["turnstile"].outcomes
    return sorted(
        (n, ts[n].reason if n in ts else "not run")
        for n, o in ls.items()
        if o.outcome == "passed" and (n not in ts or ts[n].outcome != "passed")
    )


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="+", default=list(FILES), metavar="NAME", help="suite files (test_x)")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("-k", dest="select", default=None, help="pytest -k expression")
    ap.add_argument("--keep", default=None, metavar="DIR", help="run in DIR and keep the logs (default: a temp dir)")
    ap.add_argument(
        "--write-expected", default=None, metavar="PATH", help="write turnstile's passing node ids (CI's expected set)"
    )
    ap.add_argument("--out", default=None, metavar="DIR", help=f"where to write the JSON (default: {RESULTS_DIR})")
    args = ap.parse_args(argv)
    if "llama-server" in args.systems and not os.environ.get("TURNSTILE_LLAMA_SERVER"):
        ap.error("TURNSTILE_LLAMA_SERVER is not set (make oracle prints the binary's path)")
    with tempfile.TemporaryDirectory(prefix="ts-suite-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs: dict[str, SuiteRun] = {}
        for system in args.systems:
            progress(f"{system}: {len(args.files)} files")
            runs[system] = run_suite(system, args.files, work, select=args.select)
            progress(f"{system}: {len(runs[system].outcomes)} tests in {runs[system].seconds:.0f} s")
        table = rows(runs, args.files)
        params = {"systems": ",".join(args.systems), "seconds": {s: round(r.seconds) for s, r in runs.items()}}
        path = emit(NAME, table, params=params, out=out_path(args.out, NAME))
        detail = {s: {n: [o.outcome, o.reason] for n, o in sorted(r.outcomes.items())} for s, r in runs.items()}
        path.with_name(f"{NAME}.tests.json").write_text(json.dumps(detail, indent=1))
        if args.write_expected and "turnstile" in runs:
            ok = sorted(n for n, o in runs["turnstile"].outcomes.items() if o.outcome == "passed")
            head = f"# turnstile's passing tests of llama.cpp's server suite ({', '.join(args.files)})\n"
            Path(args.write_expected).write_text(head + "".join(f"{n}\n" for n in ok))
        missing = gaps(runs)
        if missing:
            print(f"\npassed on llama-server, not on turnstile ({len(missing)}):")
            for node, reason in missing:
                print(f"  {node}: {reason[:160]}")
