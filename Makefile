# Two entry points a newcomer needs (see README): `make demo` and `make test`.
# Both create .venv: `demo` installs the light `demo` extra, `test` everything CI needs.

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider

.PHONY: install demo bench test lint types test-main test-purepython test-cudasim docs gpu-check clean

$(STAMP): pyproject.toml $(wildcard setup.py setup_cython.py)
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The demo needs far less than the test suite (no CuPy, Numba, Ray or docs tooling).
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): pyproject.toml $(wildcard setup.py setup_cython.py)
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[demo]"
	touch $(DEMO_STAMP)

## The main job: the quick start, a streaming pipeline and the quick benchmark suite.
demo: $(DEMO_STAMP)
	$(BIN)/python -m pydotcompute demo
	$(BIN)/python examples/streaming_pipeline.py
	$(BIN)/python -m pydotcompute bench --quick

bench: install
	$(BIN)/python -m pydotcompute bench

## Everything CI checks.
test: install lint types test-main test-purepython test-cudasim docs

lint: install
	$(BIN)/ruff check pydotcompute tests benchmarks examples
	$(BIN)/ruff format --check pydotcompute tests benchmarks examples

types: install
	$(BIN)/mypy pydotcompute

test-main: install
	$(PYTEST) tests --ignore=tests/cudasim

# The queue and tier tests again on the pure-Python twin of the Cython extension.
test-purepython: install
	PYDOTCOMPUTE_PUREPYTHON=1 $(PYTEST) tests/unit -k "spsc or sync_queue or cython or tier or fast_queue"

# GPU code paths under the Numba CUDA simulator, in their own process.
test-cudasim: install
	NUMBA_ENABLE_CUDASIM=1 $(PYTEST) tests/cudasim

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## On a machine with an NVIDIA GPU, in one go: the hardware tests (soak included) and the
## benchmarks with GPU rows. Uses $(PY) as it is: the interpreter that has CuPy for its driver.
gpu-check:
	$(PY) -m pytest -p no:cacheprovider tests/gpu -m cuda -v -rs
	$(PY) benchmarks/gpu_ring_kernel_benchmark.py
	$(PY) benchmarks/memory_benchmark.py --quick
	$(PY) benchmarks/pagerank_benchmark.py

clean:
	rm -rf $(VENV) build site *.egg-info
