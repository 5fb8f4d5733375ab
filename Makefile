# `make demo` and `make test` work on a fresh machine with only Python: they create .venv
# and install Cuvil with its test dependencies (torch pinned to the CPU build) first, at the
# exact versions in constraints.txt, so a fresh clone tests what was tested.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.cuvil-installed
PIP    := python -m pip install --quiet --disable-pip-version-check
LATEST := .venv-latest

.PHONY: demo test test-slow test-latest lock conformance lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP) -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m bench.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m slow

# The newest versions pyproject.toml's ranges allow, in a separate environment: lists what differs
# from constraints.txt, then runs the default suite against them.
test-latest:
	test -x $(LATEST)/bin/python || $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/$(PIP) --upgrade --upgrade-strategy eager -e ".[dev]"
	$(LATEST)/bin/python .ci/lockdiff.py constraints.txt
	$(LATEST)/bin/python -m pytest -q -n 2 -m "not slow" -p no:cacheprovider

# Rewrite constraints.txt from the environment `make test-latest` built (after it passed).
lock:
	test -x $(LATEST)/bin/python || { echo "run make test-latest first"; exit 1; }
	{ sed -n '1,/^[^#]/{/^#/p}' constraints.txt; $(LATEST)/bin/python -m pip freeze --exclude-editable \
		| grep -v '^#' | sed 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

conformance: $(STAMP)
	$(BIN)/python -m bench.onnx_conformance

lint: $(STAMP)
	$(BIN)/ruff check cuvil verify lora failsafe reports bench tests
	$(BIN)/basedpyright --project pyproject.toml

clean:
	rm -rf $(VENV) $(LATEST) .pytest_cache build *.egg-info
