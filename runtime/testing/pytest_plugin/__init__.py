"""turnstile's pytest plugin (the `pytest11` entry point `turnstile`; `-p no:turnstile` turns it off).

Fixtures:
- `turnstile`: a `Client` with the Runtime API (chat, stream, run, complete, session operations) usable from
  any test's event loop (pytest-asyncio, anyio's plugin on asyncio or trio, any loop scope), over one Runtime
  per process on its own thread (`host.Host`): the model loads once. A test's session ids live in its own
  namespace and are removed after it. Turns are greedy unless the test sets sampling.
- `turnstile_scripted`: the same client over a fresh Runtime on the scripted backend (`client.backend` is the
  `ScriptedBackend`: scripted replies, gates), no model.

Record and replay (`cassette`, `backend`): a cassette per test file (`cassettes/<file>.json` beside it, or
under --turnstile-cassette-dir) maps each request's key to the slot's reply. Record modes, as VCR.py's:
`none` replays only (a miss fails the test, naming it, its session and where the prompt differs from the
nearest recording), `once` records a cassette that does not exist yet and replays one that does,
`new_episodes` replays what is recorded and records the rest, `all` records everything again. Without a mode
a test whose cassette exists replays (`none`), any other runs the model without recording.

Cache across runs: the Runtime's disk tier lives in --turnstile-cache-dir (default
`.pytest_cache/turnstile/<model fingerprint>`), shared safely by pytest-xdist workers, so a second run of an
unchanged suite prefills almost nothing. A terminal summary line counts turns, tokens, model seconds, model
loads and cassette hits and misses.

Inert until used: this module imports only pytest at collection; the Runtime, the cassettes and (only when a
request needs the model) llama_cpp are imported by the fixtures; no directory is created before that.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from runtime.testing.pytest_plugin.backend import Counters
    from runtime.testing.pytest_plugin.cassette import Cassette
    from runtime.testing.pytest_plugin.host import Client, Host

RECORD_MODES = ("none", "once", "new_episodes", "all")
_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("model", "a GGUF file (default: the default model, SmolLM2-135M-Instruct)", ""),
    ("ctx", "the context size of the test Runtime", "2048"),
    ("threads", "threads for llama.cpp (default: physical cores)", ""),
    ("cache-dir", "the disk tier across runs, one directory per model in it (default .pytest_cache/turnstile)", ""),
    ("record-mode", "none | once | new_episodes | all (VCR.py's; default: replay if the cassette exists)", ""),
    ("cassette-dir", "where cassettes are (default: cassettes/ beside each test file)", ""),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("turnstile", "turnstile: one local model for the whole test run")
    for name, text, default in _OPTIONS:
        group.addoption(f"--turnstile-{name}", dest=f"turnstile_{name.replace('-', '_')}", default=None, help=text)
        parser.addini(f"turnstile_{name.replace('-', '_')}", text, default=default)
    group.addoption("--turnstile-no-cache", action="store_true", default=False, help="no disk tier across runs")
    parser.addini("turnstile_no_cache", "no disk tier across runs", type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "turnstile(record_mode=None, model=None, **runtime_options): the turnstile fixture's record mode, model "
        "and Runtime options (n_ctx, n_threads, engine and cache options) for a test or a module",
    )


def _option(config: pytest.Config, name: str) -> str:
    key = f"turnstile_{name}"
    value = config.getoption(key)
    return str(value) if value is not None else str(config.getini(key) or "")


class _State:
    """The plugin's per-run state (`config.stash`): the host, the cassettes, the counters of xdist workers."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._host: Host | None = None
        self.cassettes: dict[Path, Cassette] = {}
        self.workers: dict[str, Any] = {}  # controller: what each worker counted

    @property
    def host(self) -> Host:
        if self._host is None:
            from runtime.testing.pytest_plugin.host import Host

            self._host = Host()
        return self._host

    def counters(self) -> Counters | None:
        from runtime.testing.pytest_plugin.backend import Counters

        if self._host is None and not self.workers:
            return None
        total = Counters()
        if self._host is not None:
            total.add(vars(self._host.counters))
        for counted in self.workers.values():
            total.add(counted)
        return total

    def cassette(self, path: Path) -> Cassette:
        from runtime.testing.pytest_plugin.cassette import Cassette

        found = self.cassettes.get(path)
        if found is None:
            found = self.cassettes[path] = Cassette.load(path)
        return found

    def finish(self) -> None:
        try:
            for cassette in self.cassettes.values():
                cassette.save()
        finally:
            if self._host is not None:
                self._host.close()


_KEY = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    if _KEY not in config.stash:
        config.stash[_KEY] = _State(config)
    return config.stash[_KEY]


def _marked(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The `turnstile` marks' keywords, the closest (the test's own) winning over the module's."""
    found: dict[str, Any] = {}
    for mark in reversed(list(request.node.iter_markers("turnstile"))):
        found.update(mark.kwargs)
    return found


def _settings(request: pytest.FixtureRequest, marked: dict[str, Any]) -> Any:
    from runtime.llama.models import DEFAULT_FILE, default_model_path
    from runtime.testing.pytest_plugin.host import Settings

    config = request.config
    options = {k: v for k, v in marked.items() if k not in ("record_mode", "model", "n_ctx", "n_threads")}
    model_text = str(marked.get("model") or _option(config, "model"))
    if model_text:
        model = Path(model_text) if Path(model_text).is_absolute() else Path(config.invocation_params.dir, model_text)
    else:
        try:
            model = default_model_path()
        except Exception:  # not installed: replay may still serve it by name
            model = Path(DEFAULT_FILE)
    threads = marked.get("n_threads", _option(config, "threads") or None)
    no_cache = bool(config.getoption("turnstile_no_cache") or config.getini("turnstile_no_cache"))
    cache = _option(config, "cache_dir")
    root = None if no_cache else Path(cache) if cache else Path(config.rootpath, ".pytest_cache", "turnstile")
    return Settings(
        model=model,
        n_ctx=int(marked.get("n_ctx", _option(config, "ctx") or 2048)),
        n_threads=int(threads) if threads is not None else None,
        cache_root=root,
        options=tuple(sorted(options.items())),
    )


def _mode(request: pytest.FixtureRequest, marked: dict[str, Any], state: _State) -> tuple[Cassette | None, str]:
    """The test's cassette and effective mode: live, replay, record_new or record_all."""
    from runtime.errors import InvalidConfig

    mode = str(marked.get("record_mode") or _option(request.config, "record_mode"))
    if mode and mode not in RECORD_MODES:
        raise InvalidConfig(f"turnstile record mode must be one of {RECORD_MODES}, not {mode!r}")
    directory = _option(request.config, "cassette_dir")
    test_file = Path(request.node.path)
    where = Path(request.config.invocation_params.dir, directory) if directory else test_file.parent / "cassettes"
    cassette = state.cassette(where / f"{test_file.stem}.json")
    if not mode:
        return (cassette, "replay") if cassette.existed else (None, "live")
    if mode == "once":
        return cassette, "replay" if cassette.existed else "record_new"
    return cassette, {"none": "replay", "new_episodes": "record_new", "all": "record_all"}[mode]


@pytest.fixture
def turnstile(request: pytest.FixtureRequest) -> Iterator[Client]:
    """A client of the run's one Runtime for this test (see the module docstring)."""
    from runtime.testing.pytest_plugin.backend import TestContext
    from runtime.testing.pytest_plugin.host import Client

    state = _state(request.config)
    marked = _marked(request)
    settings = _settings(request, marked)
    cassette, mode = _mode(request, marked, state)
    host = state.host
    rt, backend = host.runtime(settings)
    prefix = "t" + hashlib.blake2b(request.node.nodeid.encode(), digest_size=5).hexdigest() + ":"
    backend.context = TestContext(request.node.nodeid, prefix, cassette, mode)
    if backend.context.needs_model() or (mode == "record_new" and cassette is not None and not cassette.models):
        host.preload(backend)
    client = Client(host.portal, rt, prefix, greedy=True)
    try:
        yield client
    finally:
        try:
            client.cleanup()
        finally:
            backend.context = None


@pytest.fixture
def turnstile_scripted(request: pytest.FixtureRequest) -> Iterator[Client]:
    """A client of a fresh Runtime over `ScriptedBackend` (no model); `client.backend` is the backend."""
    from runtime.api import Runtime
    from runtime.testing.pytest_plugin.host import Client
    from runtime.testing.scripted import ScriptedBackend
    from sessions import MemoryStore

    host = _state(request.config).host
    rt = host.enter(Runtime.serve(ScriptedBackend(), MemoryStore()))
    try:
        yield Client(host.portal, rt, "", greedy=False)
    finally:
        host.leave()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _KEY not in config.stash:
        return
    state = config.stash[_KEY]
    state.finish()
    counted = state.counters()
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None and counted is not None:  # an xdist worker: the controller sums them
        workeroutput["turnstile"] = vars(counted)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    counted = getattr(node, "workeroutput", {}).get("turnstile")
    if counted is not None:
        _state(node.config).workers[str(node.gateway.id)] = counted


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _KEY not in config.stash:
        return
    n = config.stash[_KEY].counters()
    if n is None:
        return
    terminalreporter.write_line(
        f"turnstile: {n.turns} turns, {n.prompt_tokens} prompt / {n.cached_tokens} cached / "
        f"{n.prefilled_tokens} prefilled tokens, {n.model_seconds:.2f} model s, {n.loads} model loads, "
        f"cassettes {n.hits} hits / {n.misses} misses / {n.recorded} recorded"
    )
