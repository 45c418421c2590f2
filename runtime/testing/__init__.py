"""Test support shipped with the library: a scripted slot backend with gates (`ScriptedBackend`, `Gate`),
tiny generated GGUF models (`runtime.testing.tiny_models`, needs the `gguf` package), the conversations
tests and benchmarks share (`runtime.testing.workloads`), a llama-server process wrapper for oracles
(`runtime.testing.llama_server`) and the pytest plugin for apps' test suites (`runtime.testing.pytest_plugin`,
the `turnstile` entry point; importing this package does not load it)."""

from runtime.testing.scripted import Gate, ScriptedBackend

__all__ = ["Gate", "ScriptedBackend"]
