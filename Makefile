# The two set-up commands: `make demo` runs skyfed, `make test` passes the tests.
# Both create .venv and install what they need on a fresh machine; `make test` also
# installs Prometheus, Chromium and chromium-driver with apt-get when they are missing
# (scripts/test_tools.sh), so no test skips for a missing tool.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-tools lint unit integration install clean catalog scenarios

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -U pip setuptools wheel
	# The CPU build of torch that lies on this disk; any other request pulls CUDA.
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[broker,edge,dev,explain]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/skyfed demo

lint: $(STAMP)
	$(BIN)/ruff check broker providers edge_agent tests scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

test-tools:
	bash scripts/test_tools.sh

test: lint test-tools
	$(BIN)/python -m pytest -q

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -q tests/integration

catalog: $(STAMP)
	$(BIN)/python scripts/build_catalog.py

scenarios: $(STAMP)
	$(BIN)/python scripts/build_scenarios.py

clean:
	rm -rf $(VENV) .skyfed .mypy_cache .ruff_cache .pytest_cache
