# make run    the main job on this machine (both modes, workers 0 and 4, tracked offline)
# make test   the test suite (CPU; starts its own Polyaxon server)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements-dev.txt | sha256sum | cut -c1-12)

.PHONY: setup run bench-alternating compare test clean

$(STAMP): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

run: $(STAMP)
	PY=$(BIN)/python ./run-local.sh main

bench-alternating: $(STAMP)
	PY=$(BIN)/python ./run-local.sh alternating

compare: $(STAMP)
	$(BIN)/python compare.py --offline .polyaxon-offline --out results/local

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf .polyaxon-offline .pytest_cache
