"""The package structure as rules over the import graph, and imports that stay light.

- no import cycles between the project's modules (every import counts: one inside a function, and one under
  `if TYPE_CHECKING:` too; a type-only need is met by a small protocol where it is used);
- only `runtime.llama` imports `llama_cpp` (and `caches.llama_cache`, which is the llama_cache API for
  llama-cpp-python users);
- the event-loop side (`runtime.loop`) imports neither the slot (`runtime.slot`) nor `runtime.llama`,
  nor the llama backend;
- `runtime.errors` and `runtime.log` import nothing of the project but each other (every package uses them);
- the HTTP and cluster adapters (`runtime.serve`) reach the model only through the `Runtime`: none imports
  the backend, the slot, `runtime.llama` or a session store;
- only `runtime.cache_rules` compares cache-rules names: the rest read its named behaviours;
- tool calling (`runtime.tools`) is pure: none of the loop, the backend, the slot, llama.cpp, the Runtime or
  the server;
- `runtime.testing` (shipped) holds only the pytest plugin and `ScriptedBackend` with what they import; the
  project's own test tooling is in `tests/support`, and nothing shipped imports `tests`;
- `import runtime`, `import runtime.tools`, `import runtime.serve.cluster.affinity` and `turnstile --help`
  leave `llama_cpp` out of `sys.modules`.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "caches", "sessions")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, package: str) -> set[str]:
    """Every module `tree` imports: at the top, inside functions, and under `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        raw = _imports(ast.parse(path.read_text(), str(path)), package)
        graph[name] = {m for m in raw if m in modules and m != name} | {
            m.split(".")[0] for m in raw if m.split(".")[0] == "llama_cpp"
        }
    return graph


GRAPH = _graph()


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_graph_is_read() -> None:
    assert "runtime.loop.scheduler" in GRAPH
    assert "llama_cpp" in GRAPH["runtime.llama.engine"]
    assert "runtime.loop.scheduler" in GRAPH["runtime.api"]


def test_no_import_cycles() -> None:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if nxt not in GRAPH:
                continue
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node, [])
    # a package's __init__ that re-exports its own modules is not a cycle of logic: skip `pkg -> pkg.mod -> pkg`
    real = [c for c in cycles if not any(_within(b, a) or _within(a, b) for a, b in itertools.pairwise(c))]
    assert real == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


def test_only_the_llama_package_imports_llama_cpp() -> None:
    importers = sorted(m for m, deps in GRAPH.items() if "llama_cpp" in deps)
    allowed = [m for m in importers if _within(m, "runtime.llama") or _within(m, "caches.llama_cache")]
    assert importers == allowed
    assert "runtime.llama.engine" in importers


def test_the_event_loop_side_imports_neither_the_slot_nor_llama() -> None:
    forbidden = ("runtime.slot", "runtime.llama", "runtime.backend.llama")
    bad = {
        m: sorted(d for d in deps if any(_within(d, p) for p in forbidden))
        for m, deps in GRAPH.items()
        if _within(m, "runtime.loop")
    }
    assert {m: d for m, d in bad.items() if d} == {}
    assert "llama_cpp" not in set().union(*(GRAPH[m] for m in GRAPH if _within(m, "runtime.loop")))


def test_the_graph_counts_imports_under_type_checking() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runtime.api import Runtime\n")
    assert "runtime.api" in _imports(tree, "runtime.loop")


STORES = ("sessions.store", "sessions.base", "sessions.disk", "sessions.raw_disk", "sessions.redis", "sessions")


def test_serve_adapters_reach_the_model_only_through_the_runtime() -> None:
    forbidden = ("runtime.backend", "runtime.slot", "runtime.llama")
    bad = {
        m: sorted(d for d in deps if any(_within(d, p) for p in forbidden) or d in STORES)
        for m, deps in GRAPH.items()
        if _within(m, "runtime.serve")
    }
    assert {m: d for m, d in bad.items() if d} == {}
    assert "runtime.api" in GRAPH["runtime.serve.http.state"]  # the graph sees the adapters


def test_the_tools_are_pure() -> None:
    """runtime/tools/README.md: tool calling imports the pure packages only."""
    forbidden = ("runtime.loop", "runtime.backend", "runtime.slot", "runtime.llama", "runtime.api", "runtime.serve")
    bad = {
        m: sorted(d for d in deps if any(_within(d, p) for p in forbidden) or d == "llama_cpp")
        for m, deps in GRAPH.items()
        if _within(m, "runtime.tools")
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_errors_and_log_are_leaves() -> None:
    assert GRAPH["runtime.errors"] == set()
    assert GRAPH["runtime.log"] <= {"runtime.errors"}


def test_sessions_and_caches_do_not_import_the_runtime_beyond_its_leaves() -> None:
    leaves = {"runtime", "runtime.errors", "runtime.log"}
    for m, deps in GRAPH.items():
        if _within(m, "sessions") or (_within(m, "caches") and not _within(m, "caches.llama_cache")):
            assert {d for d in deps if _within(d, "runtime")} <= leaves, m


def test_light_imports_leave_llama_cpp_out() -> None:
    code = (
        "import sys, runtime, runtime.tools, runtime.serve.cluster.affinity, runtime.testing, sessions, caches\n"
        "from runtime import Runtime, Reply, TurnstileError\n"
        "assert 'llama_cpp' not in sys.modules, sorted(m for m in sys.modules if m.startswith('llama_cpp'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_turnstile_help_leaves_llama_cpp_out() -> None:
    code = (
        "import sys\n"
        "from runtime.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "assert 'llama_cpp' not in sys.modules\n"
        "print('ok', file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout and out.stderr.strip().endswith("ok")


def _compares_a_rules_name(node: ast.AST) -> bool:
    """`x == "turnstile"`, `"llama-server" != y`, `x in CACHE_RULES` and the like: a string test of cache rules."""
    if not isinstance(node, ast.Compare):
        return False
    names = {"turnstile", "llama-server"}
    operands = [node.left, *node.comparators]
    strings = {o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)}
    named = {o.id if isinstance(o, ast.Name) else o.attr for o in operands if isinstance(o, ast.Name | ast.Attribute)}
    return bool(strings & names) or bool(named & {"CACHE_RULES", "cache_rules"})


def test_only_the_cache_rules_module_compares_cache_rules_names() -> None:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if _module_name(path) == "runtime.cache_rules":
                continue
            tree = ast.parse(path.read_text(), str(path))
            found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree) if _compares_a_rules_name(n)]
    assert found == []
    rules = ast.parse((ROOT / "runtime" / "cache_rules.py").read_text())
    assert any(_compares_a_rules_name(n) for n in ast.walk(rules))  # the check sees the one place that does


# What the shipped `runtime.testing` may hold: the pytest plugin, `ScriptedBackend` and its gates, and what they import.
TESTING_MODULES = {
    "runtime.testing",
    "runtime.testing.scripted",
    "runtime.testing.chars",
    "runtime.testing.pytest_plugin",
    "runtime.testing.pytest_plugin.backend",
    "runtime.testing.pytest_plugin.cassette",
    "runtime.testing.pytest_plugin.host",
}


def test_runtime_testing_holds_only_what_the_plugin_and_the_scripted_backend_need() -> None:
    assert {m for m in GRAPH if _within(m, "runtime.testing")} == TESTING_MODULES
    needed: set[str] = set()
    todo = ["runtime.testing", "runtime.testing.pytest_plugin"]
    while todo:
        m = todo.pop()
        if m not in needed:
            needed.add(m)
            todo += [d for d in GRAPH[m] if _within(d, "runtime.testing")]
    assert needed == TESTING_MODULES  # each one is reached from the plugin or from `ScriptedBackend`


def test_nothing_shipped_imports_the_tests() -> None:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = _module_name(path)
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            raw = _imports(ast.parse(path.read_text(), str(path)), package)
            found += [f"{name} imports {m}" for m in sorted(raw) if _within(m, "tests")]
    assert found == []
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'include = ["runtime*", "caches*", "sessions*"]' in pyproject  # the wheel: never tests/
