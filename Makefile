# `make demo` and `make test` set themselves up from a clean clone, each with what it needs:
# the demo the package and its demo extras (no PyTorch), the tests the test extras as well,
# and the TPU compiler (the tpu extra: tests/aot compiles for TPU slices on this host).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.demo-installed
TEST_STAMP := $(VENV)/.test-installed
DEMO_DIR ?= workdir/demo

.PHONY: demo test coverage install figures clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(DEMO_STAMP): setup.py | $(PY)
	$(PY) -m pip install -q -e ".[demo]"
	touch $@

$(TEST_STAMP): setup.py | $(PY)
	$(PY) -m pip install -q -e ".[test,demo,tpu]"
	touch $@ $(DEMO_STAMP)

# The full development environment (what the tests and the benchmarks use).
install: $(TEST_STAMP)

# GRPO on arithmetic from the shipped warm start, on the CPU; see configs/grpo_arithmetic.py.
demo: $(DEMO_STAMP)
	rm -rf $(DEMO_DIR)
	JAX_PLATFORMS=cpu $(PY) -m launch.demo --workdir=$(DEMO_DIR)

# Two workers, each taking whole files (module-level set-up is shared within a file); the
# 25 slowest tests are listed at the end (what to trim when the suite grows).
test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests

# The suite under coverage.py (.coveragerc: jaxrl_llm/ and launch/, subprocesses included):
# the per-file table and the total.
coverage: $(TEST_STAMP)
	rm -f .coverage .coverage.*
	$(PY) -m pytest -q -n 2 --dist loadfile --cov --cov-report= tests
	$(PY) -m coverage combine --append -q
	$(PY) -m coverage report

# Reruns the runs behind README's recorded figures (make demo's, the notebook's, the agent
# demo's, the MoE demo's; about half an hour on 2 CPU cores) and rewrites them there, dated.
figures: $(TEST_STAMP)
	$(PY) bench/readme_figures.py --write

clean:
	rm -rf $(VENV) .pytest_cache
