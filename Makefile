# Two commands on a fresh machine:
#   make demo   start the reference worker and the exporter (simulated GPU) on 127.0.0.1
#   make test   lint, type-check and run the whole test suite
# Each creates .venv and installs what it needs; the test target also installs
# Prometheus and Alertmanager from Debian packages when they are missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit extras install system-deps bench clean rules dashboards

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	touch $(STAMP)

install: $(STAMP)
	$(BIN)/pip install --quiet --no-deps -e . --config-settings editable_mode=strict

system-deps:
	@bash scripts/install-system-deps

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The package as installed (the editable install's tree of links), then the code that
# uses it; mypy does not report errors of an installed package it only follows into.
typecheck: install
	$(BIN)/mypy -p gpuscope
	$(BIN)/mypy $(wildcard tests/*.py tests/*/*.py benchmarks/*.py scripts/*.py)
	cd dashboards && ../$(BIN)/mypy --config-file ../pyproject.toml *.py
	cd alerts && MYPYPATH=../dashboards ../$(BIN)/mypy --config-file ../pyproject.toml *.py

unit: install system-deps
	$(BIN)/pytest -q

# Each extra alone in a fresh venv: installs, --help, a smoke test (about a minute).
extras: install
	$(BIN)/python scripts/check_extras.py

# pytest last, so that its summary closes the output
test: lint typecheck extras unit

# Regenerate the Grafana dashboards (dashboards/json/) from dashboards/build.py.
dashboards: install
	$(BIN)/python dashboards/build.py

demo: install
	$(BIN)/gpuscope demo

# Regenerate alerts/rules/*.yml from the Settings table of alerts/build.py.
rules: install
	$(BIN)/python alerts/build.py

# Every benchmark with its defaults (several minutes); see docs/benchmarks.md.
bench: install
	@for script in benchmarks/*.py; do \
		echo "== $$script"; nice $(BIN)/python $$script || exit 1; \
	done

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
