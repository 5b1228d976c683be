# The two commands of the README: `make demo` (the main job) and `make test` (the suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test sweep lint bench bench-tf conformance clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev,demo,notebooks]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m ruff check jaxdist tests benchmarks examples
	$(PY) -m mypy jaxdist
	JAXDIST_REQUIRE_DEV=1 $(PY) -m pytest -q

# The property-based sweep (tests/test_sweep_*.py) with thousands of random draws instead of CI's
# dozen derandomized ones: run it before a change to the split, the Keras steps or the
# partial-batch machinery lands. SWEEP_EXAMPLES draws per custom-loop test (Keras: a tenth).
SWEEP_EXAMPLES ?= 2000
sweep: $(STAMP)
	JAXDIST_SWEEP=1 JAXDIST_SWEEP_EXAMPLES=$(SWEEP_EXAMPLES) JAXDIST_REQUIRE_DEV=1 \
		$(PY) -m pytest -q tests/test_sweep_split.py tests/test_sweep_keras.py tests/test_sweep_multiworker.py

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

clean:
	rm -rf $(VENV) build *.egg-info
