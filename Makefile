# `make demo` and `make test` set themselves up from a clean clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= workdir/demo

.PHONY: demo test install clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,demo]"
	touch $(STAMP)

install: $(STAMP)

# GRPO on arithmetic from the shipped warm start, on the CPU; see configs/grpo_arithmetic.py.
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	JAX_PLATFORMS=cpu $(PY) -m launch.demo --workdir=$(DEMO_DIR)

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .pytest_cache
