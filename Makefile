# `make demo` and `make test` work on a fresh machine with only Python: they create .venv
# and install Cuvil with its test dependencies (torch pinned to the CPU build) first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.cuvil-installed

.PHONY: demo test test-slow conformance lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m bench.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m slow

conformance: $(STAMP)
	$(BIN)/python -m bench.onnx_conformance

lint: $(STAMP)
	$(BIN)/ruff check cuvil verify lora failsafe reports bench tests

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
