"""Test-only tooling shared by the tests and the benchmarks (never shipped): tiny GGUF writers, the oracle gate and
the llama-server wrapper, the vendored llama.cpp tree, shared workloads, process and server helpers, the cases
tables. Import as `from tests.support.NAME import ...`."""
