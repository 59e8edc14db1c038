# Two entry points a newcomer needs (see README): `make demo` and `make test`.
# Both create .venv: `demo` installs the light `demo` extra, `test` everything CI needs.

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/python -m pytest -p no:cacheprovider
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install demo bench dist test lint types test-main test-purepython test-cudasim test-versions docs gpu-check gpu-wheels gpu-check-step clean

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

## For users of the library: dist/pydotcompute-<version>.tar.gz and a wheel for this Python
## with the compiled extensions, built from the sdist as pip would (without a C compiler the
## wheel still builds, on the pure-Python twins). Needs only `build`, in a small venv of its
## own. tests/integration/test_distribution.py builds the same way and installs the wheel.
BUILD_VENV := .venv-build
$(BUILD_VENV)/.stamp:
	$(PY) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/python -m pip --disable-pip-version-check -q install "build>=1.0"
	touch $@

dist: $(BUILD_VENV)/.stamp
	rm -rf dist
	$(BUILD_VENV)/bin/python -m build --outdir dist .

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

# On TEST_WORKERS pytest-xdist workers: the suite mostly waits (child processes, Ray actors,
# timeouts), using about a fifth of two cores on one worker. The Ray tests share one worker
# (tests/conftest.py); `make test-main TEST_WORKERS=0` runs it all in one process.
TEST_WORKERS ?= 3
test-main: install
	$(PYTEST) -q tests --ignore=tests/cudasim --durations=25 -n $(TEST_WORKERS)

# The queue and tier tests again on the pure-Python twin of the Cython extension.
test-purepython: install
	PYDOTCOMPUTE_PUREPYTHON=1 $(PYTEST) -q tests/unit -k "spsc or sync_queue or cython or tier or fast_queue or message or telemetry"

# GPU code paths under the Numba CUDA simulator, in their own process.
test-cudasim: install
	NUMBA_ENABLE_CUDASIM=1 $(PYTEST) -q tests/cudasim

# The unit tests and the tier contract again on the newest Python the package supports (what
# differs between versions: asyncio, eager tasks from 3.12, the message and queue cores): with
# test-main on the oldest (3.11) the two ends of the range are checked; 3.12 sits between them
# and is not run by default, for CI's time (`make test-versions OTHER_PYTHONS="3.12 3.13"`).
# Each one found here (on PATH or under pyenv); a light install (no CUDA, Metal, Ray or docs
# tooling: their tests skip and say why). A version that is not installed is reported and
# skipped. The whole suite runs once, in test-main. (The contract's process cases run in test-main only: a child process runs the
# same ring and framing code on every Python, and they are most of the contract's time; the
# asyncio and thread cases carry what differs between versions. They run on the standard
# library's loop, which is what differs: PYDOTCOMPUTE_TEST_LOOPS=asyncio; uvloop is
# checked in test-main.)
OTHER_PYTHONS ?= 3.13
VERSION_TESTS ?= tests/unit tests/integration/test_tier_contract.py tests/integration/test_shutdown.py \
	tests/integration/test_quickstart.py -k "not process"
test-versions:
	@failed=; for v in $(OTHER_PYTHONS); do \
	  py=; for c in $$(ls -d $$HOME/.pyenv/versions/$$v.*/bin/python 2>/dev/null) python$$v; do \
	    if $$c -c "" 2>/dev/null; then py=$$c; break; fi; \
	  done; \
	  if [ -z "$$py" ]; then echo "test-versions: no Python $$v on this machine: skipped"; continue; fi; \
	  venv=.venv-py$$v; \
	  if [ ! $$venv/.stamp -nt pyproject.toml ]; then \
	    $$py -m venv $$venv && $$venv/bin/python -m pip --disable-pip-version-check -q install --upgrade pip && \
	    $$venv/bin/python -m pip --disable-pip-version-check -q install -e ".[fast,cython,test]" && touch $$venv/.stamp || exit 1; \
	  fi; \
	  echo "== unit tests and the tier contract on Python $$v ($$py)"; \
	  PYDOTCOMPUTE_TEST_LOOPS=asyncio $$venv/bin/python -m pytest -p no:cacheprovider -q $(VERSION_TESTS) || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-versions: failed on Python$$failed"; exit 1; fi

# The build, then a check that no reST markup (":class:`X`", a "::" literal-block marker)
# leaked into the pages; pages still being converted are listed in tools/docs_rest_pending.txt.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python tools/check_docs_html.py site --pending tools/docs_rest_pending.txt

## The hardware check, ONE bounded command for a GPU machine (docs/guides/gpu-actors.md,
## "Checking a GPU machine"): installs the wheels of .whl/ the image lacks into a private
## folder, builds the extensions in place, then the GPU steps, each under `timeout`, inside
## GPU_CHECK_BUDGET seconds; summary.json in GPU_CHECK_OUT is rewritten after every step.
## Uses $(PY) as it is: on the GPU machine the image's python3 (CuPy, Numba, pytest).
## The outer `timeout` is a last resort: the check ends itself inside its budget.
GPU_CHECK_OUT ?= gpu-check-out
GPU_CHECK_BUDGET ?= 420
GPU_CHECK_ARGS ?=
gpu-check:
	timeout -k 10 $$(( $(GPU_CHECK_BUDGET) + 30 )) $(PY) tests/gpu/gpu_check.py \
	  --out $(GPU_CHECK_OUT) --budget $(GPU_CHECK_BUDGET) --wheels .whl $(GPU_CHECK_ARGS)

## Here, with network: fetch into .whl/ (git-ignored) exactly what the GPU image lacks, as
## cp312 manylinux x86-64 wheels: msgspec and pytest-asyncio (their other requirements,
## pytest and typing-extensions, are in the image). Pin both here to change them.
GPU_WHEELS ?= msgspec==0.22.0 pytest-asyncio==1.5.0
gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)
	$(PY) tests/gpu/gpu_check.py --check-wheels .whl

## One or more steps of the check alone (STEP="smoke suite"), e.g. to rerun what failed.
STEP ?= smoke
gpu-check-step:
	$(MAKE) --no-print-directory gpu-check GPU_CHECK_ARGS="--steps install,build,$(shell echo $(STEP) | tr ' ' ',') $(GPU_CHECK_ARGS)"

clean:
	rm -rf $(VENV) .venv-py3.* $(BUILD_VENV) build dist site *.egg-info .test-steps.jsonl
