# Quick start: `make demo` runs the main job, `make test` runs the whole suite.
# Both create (or reuse) a local virtual environment in .venv and install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# PyTorch: this machine kind has a CPU build of 2.13.0 on disk; elsewhere any torch>=2.1 works.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test docs fuzz opinfo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m pip install -q '$(TORCH_SPEC)' || $(BIN)/python -m pip install -q torch
	$(BIN)/python -m pip install -q jax jaxlib
	touch $(VENV)/.core-installed $@

demo: $(VENV)/.core-installed
	$(BIN)/python -m pullback demo

# worksteal: a worker that runs out of tests takes half of the other's queue (the slow tests run first, see tests/conftest.py).
# The workers share the cores, so the idle threads of PyTorch's OpenMP pool and NumPy's OpenBLAS sleep at once instead
# of spinning (measured: the torch-heavy test files take 10% less time and CPU).
PARALLEL_ENV := OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4
test: $(VENV)/.test-installed
	$(PARALLEL_ENV) $(BIN)/python -m pytest -n auto --dist worksteal tests

# long property runs and the parser fuzzer (CI runs a bounded number of examples in `make test`)
FUZZ_SECONDS ?= 300
fuzz: $(VENV)/.test-installed
	$(BIN)/python scripts/fuzz.py --seconds $(FUZZ_SECONDS)
	$(BIN)/python -m pytest tests/properties tests/fuzz -q --hypothesis-profile long

# every sample of PyTorch's OpInfo database for the Core ATen operators (make test runs a few per operator) on
# OPINFO_JOBS worker processes; rewrites docs/opinfo.md and fails when a sample gives a wrong value or gradient.
# OPINFO_BUDGET=SECONDS caps each OpInfo's time (the samples left out are counted as "not run" on the page).
OPINFO_JOBS ?= 2
OPINFO_BUDGET ?=
opinfo: $(VENV)/.test-installed
	$(PARALLEL_ENV) $(BIN)/python scripts/opinfo_report.py -n $(OPINFO_JOBS) $(if $(OPINFO_BUDGET),--budget $(OPINFO_BUDGET))

docs: $(VENV)/.core-installed
	$(BIN)/python -m pip install -q mkdocs
	$(BIN)/python scripts/gen_op_table.py --check
	$(BIN)/python -m mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache build site src/*.egg-info
