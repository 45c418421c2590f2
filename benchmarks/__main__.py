"""`python -m benchmarks NAME [options]`: run one benchmark (or `all`), print its table, write its JSON."""

from __future__ import annotations

import importlib
import sys

# name -> module in this package; each module has `main(argv: list[str]) -> None`.
BENCHMARKS: dict[str, str] = {}


def _register() -> None:
    import pkgutil
    from pathlib import Path

    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.startswith("_"):
            BENCHMARKS[info.name.replace("_", "-")] = info.name


def main(argv: list[str] | None = None) -> int:
    _register()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print("usage: python -m benchmarks NAME [options]   (NAME: all, " + ", ".join(sorted(BENCHMARKS)) + ")")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    names = sorted(BENCHMARKS) if name == "all" else [name]
    for n in names:
        if n not in BENCHMARKS:
            print(f"unknown benchmark {n!r}; known: {', '.join(sorted(BENCHMARKS))}", file=sys.stderr)
            return 2
        importlib.import_module(f"benchmarks.{BENCHMARKS[n]}").main(rest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
