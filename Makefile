# Two commands on a fresh machine:
#   make demo   start the reference worker and the exporter (simulated GPU) on 127.0.0.1
#   make test   lint, type-check and run the whole test suite
# Each creates .venv and installs what it needs; the test target also installs
# Prometheus and Alertmanager from Debian packages when they are missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit install system-deps bench clean rules dashboards

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

# mypy runs from build/ so that the repository's own gpuscope/ folder does not
# shadow the installed package (whose subpackages are mapped from other folders).
typecheck: install
	cd build && ../$(BIN)/mypy --config-file ../pyproject.toml __editable__.gpuscope-*/gpuscope $(addprefix ../,$(wildcard tests/*.py tests/*/*.py benchmarks/*.py))
	cd dashboards && ../$(BIN)/mypy --config-file ../pyproject.toml *.py
	cd alerts && ../$(BIN)/mypy --config-file ../pyproject.toml build.py

unit: install system-deps
	$(BIN)/pytest -q

test: lint typecheck unit

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
