"""Test support shipped with the library: a scripted slot backend with gates (`ScriptedBackend`, `Gate`) and
the pytest plugin for apps' test suites (`runtime.testing.pytest_plugin`, the `turnstile` entry point;
importing this package does not load it). Nothing else: the project's own test tooling (tiny GGUF writers,
the oracle and llama-server wrapper, workloads) is in `tests/support/`, which is not shipped."""

from runtime.testing.scripted import Gate, ScriptedBackend

__all__ = ["Gate", "ScriptedBackend"]
