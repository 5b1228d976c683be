# The two commands of the README: `make demo` (the main job) and `make test` (the suite).
PYTHON ?= python3
# Python caches each module's bytecode (its default) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE, set on some CI images): the suite starts about 150 fresh
# interpreters (workers, notebooks, docs examples), each compiling jaxdist's and the tests'
# sources anew without it.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-checked test-fast test-latest sweep lint bench bench-tf conformance docs docs-serve wheel-smoke clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,demo,notebooks]"
	touch $(STAMP)

# The demo runs in a venv of its own, lighter than .venv: jaxdist's runtime dependencies and the
# `demo` extra only (optax, scikit-learn for the digits, tqdm, matplotlib for the loss curve),
# not the development toolchain that `make test` installs.
DEMO_VENV := .venv-demo
DPY := $(DEMO_VENV)/bin/python
DEMO_STAMP := $(DEMO_VENV)/.installed

$(DEMO_STAMP): pyproject.toml
	test -x $(DPY) || $(PYTHON) -m venv $(DEMO_VENV)
	$(DPY) -m pip install -q --upgrade pip
	$(DPY) -m pip install -q -e ".[demo]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DPY) examples/demo.py

# The suite in two runs that together select every test, each on TEST_JOBS pytest processes
# (pytest-xdist; each has its 8 simulated devices, and a test's time is mostly one core's
# tracing and compiling): the tests of one process, then the tests that start several processes
# (marked multiworker) after them, so that no test of one process competes with their workers
# (their fault deadlines allow a loaded machine's process starts; docs/benchmarks.md has the
# margins measured with two such tests at once).
TEST_JOBS ?= 2
PARALLEL = -n $(TEST_JOBS) --dist worksteal

test: $(STAMP)
	$(PY) -m ruff check jaxdist tests benchmarks examples
	$(PY) -m mypy jaxdist
	JAXDIST_REQUIRE_DEV=1 $(PY) -m pytest -q $(PARALLEL) -m "not multiworker"
	JAXDIST_REQUIRE_DEV=1 $(PY) -m pytest -q $(PARALLEL) -m multiworker

# The state and jd.function tests again under the state check mode (JAXDIST_CHECK_STATE=1: every
# call of a compiled step is traced again and compared with the cached program), so that a route the
# state tracking misses fails a test even where the test's own expected value is wrong. CI runs it.
CHECKED_TESTS := tests/state/test_state_*.py tests/state/test_captured_state.py \
	tests/state/test_replica_state.py tests/state/test_function_routes.py tests/state/test_recheck.py \
	tests/state/test_argument_state.py tests/state/test_step_objects.py \
	tests/run/test_function.py tests/run/test_function_outputs.py
test-checked: $(STAMP)
	JAXDIST_CHECK_STATE=1 JAXDIST_REQUIRE_DEV=1 $(PY) -m pytest -q $(PARALLEL) $(CHECKED_TESTS)

# The inner loop while editing: ruff and the suite without its slow tier (tests marked `slow` by
# tests/conftest.py: several processes, notebooks, docs examples, the sweeps, the slowest files).
# `make test` (above, and CI) stays the whole suite: run it before a commit.
test-fast: $(STAMP)
	$(PY) -m ruff check jaxdist tests benchmarks examples
	JAXDIST_REQUIRE_DEV=1 $(PY) -m pytest -q $(PARALLEL) -m "not slow"

# The property-based sweep (tests/*/test_sweep_*.py) with thousands of random draws instead of CI's
# dozen derandomized ones: run it before a change to the split, the Keras steps or the
# partial-batch machinery lands. SWEEP_EXAMPLES draws per custom-loop test (Keras: a tenth).
SWEEP_EXAMPLES ?= 2000
sweep: $(STAMP)
	JAXDIST_SWEEP=1 JAXDIST_SWEEP_EXAMPLES=$(SWEEP_EXAMPLES) JAXDIST_REQUIRE_DEV=1 \
		$(PY) -m pytest -q tests/package/test_sweep_split.py tests/keras_wing/test_sweep_keras.py tests/package/test_sweep_multiworker.py

# The newest JAX (it needs Python 3.12+): a venv of its own, the newest jax installed FIRST,
# then jaxdist with its extras; installing jaxdist must leave jax and jaxlib as they were.
# (pyenv's shims answer `command -v` for versions that are not active: ask each one to run)
LATEST_PYTHON ?= $(shell for p in $$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -V | head -n 1) python3.12 python3.13; do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { command -v $$p || echo $$p; } && break; done)
LATEST_VENV := .venv-latest
LPY := $(LATEST_VENV)/bin/python
LATEST_STAMP := $(LATEST_VENV)/.installed
JAX_PINS = $(LPY) -m pip list --format=freeze 2>/dev/null | grep -E '^(jax|jaxlib)=='

$(LATEST_STAMP): pyproject.toml
	@test -n "$(LATEST_PYTHON)" || { echo "test-latest needs Python 3.12+ (set LATEST_PYTHON)"; exit 1; }
	test -x $(LPY) || $(LATEST_PYTHON) -m venv $(LATEST_VENV)
	$(LPY) -m pip install -q --upgrade pip
	$(LPY) -m pip install -q --upgrade jax jaxlib
	$(JAX_PINS) > $(LATEST_VENV)/jax-before.txt
	$(LPY) -m pip install -q -e ".[dev,demo,notebooks]"
	$(JAX_PINS) > $(LATEST_VENV)/jax-after.txt
	@diff $(LATEST_VENV)/jax-before.txt $(LATEST_VENV)/jax-after.txt || \
		{ echo "installing jaxdist changed JAX (above): the dependency range is wrong"; exit 1; }
	@echo "JAX kept as installed: $$(tr '\n' ' ' < $(LATEST_VENV)/jax-after.txt)"
	touch $(LATEST_STAMP)

test-latest: $(LATEST_STAMP)
	JAXDIST_REQUIRE_DEV=1 $(LPY) -m pytest -q $(PARALLEL) -m "not multiworker"
	JAXDIST_REQUIRE_DEV=1 $(LPY) -m pytest -q $(PARALLEL) -m multiworker

lint: $(STAMP)
	$(PY) -m ruff check jaxdist tests benchmarks examples
	$(PY) -m ruff format --check jaxdist tests benchmarks

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

# The peer benchmark against TF's MirroredStrategy. TF runs in its own venv (never jaxdist's):
# JAXDIST_TF_PYTHON if set, else .venv-tf (created here if missing).
# make bench-tf BENCH_TF_ARGS=--quick for a short run.
TF_VENV := .venv-tf
bench-tf: $(STAMP)
	@if [ -z "$$JAXDIST_TF_PYTHON" ] && [ ! -x $(TF_VENV)/bin/python ]; then \
		echo "creating $(TF_VENV) (tensorflow-cpu)"; \
		$(PYTHON) -m venv $(TF_VENV) && $(TF_VENV)/bin/pip install tensorflow-cpu numpy; \
	fi
	$(PY) -m benchmarks.bench_tf_peer $(BENCH_TF_ARGS)

conformance: $(STAMP)
	$(PY) ../shared/conformance/run_jaxdist.py .

# The docs site (docs/, mkdocs.yml) into site/, warnings as errors. Installs the `docs` extra into
# the same .venv; the notebooks are rendered as they are stored (tests/package/test_notebooks.py runs them).
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

# Builds the sdist and wheel, installs the wheel into a fresh venv and runs tests/wheel_smoke.py
# against it (outside the source tree). jax, jaxlib and numpy are pinned to the dev venv's versions,
# so pip takes them from its cache instead of downloading them again.
wheel-smoke: $(STAMP)
	bash tests/wheel_smoke.sh $(PY)

clean:
	rm -rf $(VENV) $(DEMO_VENV) build dist site *.egg-info
