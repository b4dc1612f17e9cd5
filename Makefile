# make run     the main job on this machine: profile and bench, workers 0 and 4, tracked offline;
#              ends with the bench rates, the trace evidence and the traces to open (steplens report)
# make test    the test suite (CPU; starts and stops its own Polyaxon server on 127.0.0.1), on TEST_WORKERS
#              processes (pytest-xdist, 3 by default on the CI machine's 2 cores: a third of the suite's time
#              waits on sleeps, servers and subprocesses); ends with the ten slowest tests
# make lint    ruff: the format check and the linter (line length 120)
# make viewer  Polyaxon's UI over the local runs, on 127.0.0.1:8001, with its scripts served locally
# make mutation  mutation testing of the core (mutmut, one module after another, one worker; MODULES="stats verdict"
#              picks some); slow, so neither make test nor CI runs it; the report goes to results/mutation/
# All build .venv from requirements-dev.txt first (6.3 GB: torch brings its CUDA libraries even on
# a CPU-only machine); it is rebuilt when that file or pyproject.toml changes.
PYTHON ?= python3
TEST_WORKERS ?= 3
VENV := .venv
BIN := $(VENV)/bin
# pyproject.toml too: its console command and extras are installed with the package (-e . in requirements-dev.txt)
STAMP := $(VENV)/.installed-$(shell cat requirements-dev.txt pyproject.toml | sha256sum | cut -c1-12)

.PHONY: setup run bench-alternating compare test mutation lint format viewer clean

$(STAMP): requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

run: $(STAMP)
	PY=$(BIN)/python scripts/run-local.sh main

# REPEATS=6 WORKERS="0 4" by default: 6 pairs are the fewest for a sign-test verdict in steplens compare
bench-alternating: $(STAMP)
	PY=$(BIN)/python scripts/run-local.sh alternating

compare: $(STAMP)
	$(BIN)/steplens compare --offline .polyaxon-offline --out results/local

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=10 tests

mutation: $(STAMP)
	$(BIN)/python scripts/mutation.py $(MODULES)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

viewer: $(STAMP)
	$(BIN)/steplens viewer --path .polyaxon-offline --port $(or $(PORT),8001)

clean:
	rm -rf .polyaxon-offline .pytest_cache
