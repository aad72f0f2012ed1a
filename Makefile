# `make demo` and `make test` set themselves up from a clean clone, each with what it needs:
# the demo the package and its demo extras (no PyTorch), the tests the test extras as well,
# and the TPU compiler (the tpu extra: tests/aot compiles for TPU slices on this host).
PYTHON ?= python3
# pip byte-compiles every module it installs (a minute of a clean clone's set-up, most of
# them never imported); --no-compile leaves that to Python, on first import, for the
# modules a run imports, which needs bytecode writing on.
PIP_INSTALL = $(PY) -m pip install -q --no-compile
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
# The installs go through uv's pip interface (it resolves and installs in parallel: the test
# environment from a clean clone in about 15 s, pip's took 80), with pip's own indexes,
# find-links and constraints (.ci/uv_flags.py); through pip where uv cannot be installed or
# fails. Neither byte-compiles.
UV := $(VENV)/bin/uv
DEMO_PACKAGES := -e ".[demo]"
TEST_PACKAGES := -e ".[test,demo,tpu]"
INSTALL = { flags=$$($(PY) .ci/uv_flags.py) && $(UV) pip install -q --python $(PY) $$flags $(1); } \
	|| $(PIP_INSTALL) $(1)
DEMO_STAMP := $(VENV)/.demo-installed
TEST_STAMP := $(VENV)/.test-installed
DEMO_DIR ?= workdir/demo

.PHONY: demo test coverage install figures clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv || $(PY) -m pip install -q --upgrade pip

$(DEMO_STAMP): setup.py | $(PY)
	$(call INSTALL,$(DEMO_PACKAGES))
	touch $@

$(TEST_STAMP): setup.py | $(PY)
	$(call INSTALL,$(TEST_PACKAGES))
	touch $@ $(DEMO_STAMP)

# The full development environment (what the tests and the benchmarks use).
install: $(TEST_STAMP)

# GRPO on arithmetic from the shipped warm start, on the CPU; see configs/grpo_arithmetic.py.
demo: $(DEMO_STAMP)
	rm -rf $(DEMO_DIR)
	JAX_PLATFORMS=cpu $(PY) -m launch.demo --workdir=$(DEMO_DIR)

# Every test, in two sessions (docs/testing.md): the tests marked `mesh` on 8 CPU devices,
# then all others on 1. Each session has two workers (one per core), each taking whole files
# (module-level set-up is shared within a file), the longest first (tests/budget.py). The
# last listing is the budget: any test over 30 s or file over 90 s, and why it must be.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder
BUDGET := .pytest_cache/budget
# The mesh session collects only the files that mark tests `mesh` (each worker imports what
# it collects; tests/conftest.py refuses a mesh test in a file this would miss).
MESH_FILES = $(shell grep -rl --include='*_test.py' 'pytest.mark.mesh' tests)
SESSIONS = status=0; rm -rf $(BUDGET); \
	JAXRL_TEST_BUDGET=$(BUDGET) JAXRL_TEST_DEVICES=8 $(PYTEST) $(1) -m mesh $(MESH_FILES) || status=$$?; \
	JAXRL_TEST_BUDGET=$(BUDGET) JAXRL_TEST_DEVICES=1 $(PYTEST) $(2) -m "not mesh" tests || status=$$?; \
	exit $$status

test: $(TEST_STAMP)
	@$(call SESSIONS,,)

# The suite under coverage.py (.coveragerc: jaxrl_llm/ and launch/, subprocesses included):
# the per-file table and the total.
coverage: $(TEST_STAMP)
	rm -f .coverage .coverage.*
	-@$(call SESSIONS,--cov --cov-report=,--cov --cov-append --cov-report=)
	$(PY) -m coverage combine --append -q
	$(PY) -m coverage report

# Reruns the runs behind README's recorded figures (make demo's, the notebook's, the agent
# demo's, the MoE demo's; about half an hour on 2 CPU cores) and rewrites them there, dated.
figures: $(TEST_STAMP)
	$(PY) bench/readme_figures.py --write

clean:
	rm -rf $(VENV) .pytest_cache
