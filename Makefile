# Two entry points a newcomer needs (see README): `make demo` and `make test`.
# Both create .venv: `demo` installs the light `demo` extra, `test` everything CI needs.

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install demo bench test lint types test-main test-purepython test-cudasim test-versions docs gpu-check gpu-wheels gpu-check-step clean

$(STAMP): pyproject.toml $(wildcard setup.py setup_cython.py)
	$(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The demo needs far less than the test suite (no CuPy, Numba, Ray or docs tooling).
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): pyproject.toml $(wildcard setup.py setup_cython.py)
	$(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e ".[demo]"
	touch $(DEMO_STAMP)

## The main job: the quick start, a streaming pipeline and the quick benchmark suite.
demo: $(DEMO_STAMP)
	$(BIN)/python -m pydotcompute demo
	$(BIN)/python examples/streaming_pipeline.py
	$(BIN)/python -m pydotcompute bench --quick

bench: install
	$(BIN)/python -m pydotcompute bench

## Everything CI checks: every step runs (a failing one does not stop the rest), then one
## summary of them all; make exits non-zero when any step failed.
## (tools/run_step.py needs only the standard library, so $(PY) runs it even when the
## install step is the one that failed.)
TEST_STEPS := install lint types test-main test-purepython test-cudasim test-versions docs
TEST_RECORD := .test-steps.jsonl
test:
	@rm -f $(TEST_RECORD)
	@for step in $(TEST_STEPS); do \
	  echo "== make $$step"; \
	  $(PY) tools/run_step.py --record $(TEST_RECORD) --name $$step -- \
	    $(MAKE) --no-print-directory $$step; \
	done; \
	$(PY) tools/run_step.py --summary $(TEST_RECORD)

LINT_PATHS := pydotcompute tests benchmarks examples tools
lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

types: install
	$(BIN)/mypy pydotcompute

test-main: install
	$(PYTEST) -q tests --ignore=tests/cudasim

# The queue and tier tests again on the pure-Python twin of the Cython extension.
test-purepython: install
	PYDOTCOMPUTE_PUREPYTHON=1 $(PYTEST) -q tests/unit -k "spsc or sync_queue or cython or tier or fast_queue or message or telemetry"

# GPU code paths under the Numba CUDA simulator, in their own process.
test-cudasim: install
	NUMBA_ENABLE_CUDASIM=1 $(PYTEST) -q tests/cudasim

# The suite again on the other Pythons the package supports, each one found here (on PATH or
# under pyenv); a light install (no CUDA, Metal, Ray or docs tooling: their tests skip and
# say why). A version that is not installed is reported and skipped.
OTHER_PYTHONS ?= 3.12 3.13
test-versions:
	@for v in $(OTHER_PYTHONS); do \
	  py=; for c in $$(ls -d $$HOME/.pyenv/versions/$$v.*/bin/python 2>/dev/null) python$$v; do \
	    if $$c -c "" 2>/dev/null; then py=$$c; break; fi; \
	  done; \
	  if [ -z "$$py" ]; then echo "test-versions: no Python $$v on this machine: skipped"; continue; fi; \
	  venv=.venv-py$$v; \
	  if [ ! $$venv/.stamp -nt pyproject.toml ]; then \
	    $$py -m venv $$venv && $$venv/bin/python -m pip --disable-pip-version-check -q install --upgrade pip && \
	    $$venv/bin/python -m pip --disable-pip-version-check -q install -e ".[fast,cython,test]" && touch $$venv/.stamp || exit 1; \
	  fi; \
	  echo "== the suite on Python $$v ($$py)"; \
	  $$venv/bin/python -m pytest -p no:cacheprovider -q tests --ignore=tests/cudasim || exit 1; \
	done

# The build, then a check that no reST markup (":class:`X`", a "::" literal-block marker)
# leaked into the pages; pages still being converted are listed in tools/docs_rest_pending.txt.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python tools/check_docs_html.py site --pending tools/docs_rest_pending.txt

## On a machine with an NVIDIA GPU, in one go: the hardware tests (soak included) and the
## benchmarks with GPU rows. Uses $(PY) as it is: the interpreter that has CuPy for its driver.
gpu-check:
	$(PY) -m pytest -p no:cacheprovider tests/gpu -m cuda -v -rs
	$(PY) benchmarks/gpu_ring_kernel_benchmark.py
	$(PY) benchmarks/memory_benchmark.py --quick
	$(PY) benchmarks/pagerank_benchmark.py

## The hardware check in short steps (docs/guides/gpu-actors.md, "Checking a GPU machine").
## Here, with network: fetch the cp312 wheels a bare CUDA image lacks into .whl/ (git-ignored).
GPU_WHEELS ?= msgspec==0.22.0 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.3 \
	pygments==2.21.0 pytest-asyncio==1.5.0 typing-extensions==4.16.0 pytest-timeout==2.4.0
gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)
	ls -l .whl

## On the GPU machine: one or more steps (versions compile probe suite bench-quick bench soak),
## each under its own limit, writing $(OUT)/<step>.log and $(OUT)/<step>.json.
STEP ?= versions
OUT ?= gpu-check-out
gpu-check-step:
	$(PY) tests/gpu/gpu_check.py --wheels .whl --out $(OUT) $(STEP)

clean:
	rm -rf $(VENV) .venv-py3.* build site *.egg-info .test-steps.jsonl
