"""docker-compose.yml, the Dockerfile and the Grafana provisioning, checked without Docker.

The compose file is validated against the Compose specification's JSON schema; every
file it mounts must exist; the Prometheus configuration is checked by promtool in a
folder laid out as the container sees it (config and mounted rules side by side).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.engines import ENGINES
from gpuscope import flags
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.simulated import simulated_uuid
from gpuscope.worker.config import WorkerConfig
from support.binaries import require_binary
from support.dashboards_json import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROVISIONING = REPO / "dashboards" / "provisioning"


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path, container path) of every ``./...`` volume of ``service``."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts.append((REPO / source, target))
    return mounts


def test_compose_file_follows_the_compose_specification() -> None:
    check = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run(
        [str(check), "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_mounted_file_exists(name: str) -> None:
    for source, _ in bind_mounts(SERVICES[name]):
        assert source.exists(), f"{name} mounts {source.relative_to(REPO)}, which is missing"


def test_the_image_build_copies_what_exists() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = re.findall(r"^COPY (.+) \S+$", dockerfile, re.MULTILINE)
    for line in copied:
        for source in line.split():
            assert (REPO / source).exists(), f"Dockerfile copies missing {source}"
    lines = (REPO / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not {s.rstrip("/") for line in copied for s in line.split()} & set(ignored)


def test_ports_are_published_on_loopback_only() -> None:
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_third_party_images_are_pinned() -> None:
    for name, service in SERVICES.items():
        if "build" in service:
            continue
        image = service["image"]
        tag = image.rpartition(":")[2]
        assert ":" in image and re.match(r"v?\d+\.\d+\.\d+$", tag), f"{name}: {image}"


def test_gpu_services_reserve_nvidia_devices() -> None:
    gpu = [name for name, service in SERVICES.items() if "gpu" in service.get("profiles", [])]
    assert sorted(gpu) == ["exporter-gpu", "worker-gpu"]
    for name in gpu:
        devices = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_cpu_profile_runs_on_the_simulated_gpu() -> None:
    cpu = {name for name, service in SERVICES.items() if "cpu" in service.get("profiles", [])}
    assert cpu == {"exporter-cpu", "worker-cpu", "load"}
    assert SERVICES["exporter-cpu"]["environment"]["GPUSCOPE_GPU_SOURCE"] == "simulated"
    # The worker names simulated GPU 0, so its requests join that GPU's series.
    assert f"--gpu-uuid={simulated_uuid(0)}" in SERVICES["worker-cpu"]["command"]
    for name in ("exporter-cpu", "exporter-gpu"):
        assert "--forward-otlp=http://tempo:4318/v1/traces" in SERVICES[name]["command"]
        assert SERVICES[name]["networks"]["default"]["aliases"] == ["exporter"]
    assert "--enable-feature=exemplar-storage" in SERVICES["prometheus"]["command"]


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """The config with the rule files mounted beside it, as in the container."""
    promtool = require_binary("promtool")
    etc = tmp_path / "etc-prometheus"
    for source, target in bind_mounts(SERVICES["prometheus"]):
        assert target.startswith("/etc/prometheus/"), target
        destination = etc / target.removeprefix("/etc/prometheus/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination)
        else:
            shutil.copy(source, destination)
    config = etc / "prometheus.yml"
    patterns = yaml.safe_load(config.read_text())["rule_files"]
    assert all(list(etc.glob(pattern)) for pattern in patterns), "a rule_files glob is empty"
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_grafana_provisioning_matches_the_mounts() -> None:
    mounts = {target: source for source, target in bind_mounts(SERVICES["grafana"])}
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "gpuscope.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert mounts[path] == REPO / "dashboards" / "json"
    home = SERVICES["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (mounts[path] / Path(home).relative_to(path)).is_file()


def test_exemplars_link_to_the_tempo_datasource() -> None:
    sources = yaml.safe_load((PROVISIONING / "datasources" / "gpuscope.yml").read_text())
    by_uid = {source["uid"]: source for source in sources["datasources"]}
    assert {source["type"] for source in by_uid.values()} == {
        "prometheus",
        "tempo",
        "alertmanager",
    }
    prometheus = next(s for s in by_uid.values() if s["type"] == "prometheus")
    links = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    # The exporter's exemplars carry trace_id (and span_id) labels.
    assert [(link["name"], by_uid[link["datasourceUid"]]["type"]) for link in links] == [
        ("trace_id", "tempo")
    ]


def host_path(service: dict[str, Any], container_path: str) -> str:
    """The repository path a container path of ``service`` is mounted from."""
    for source, target in bind_mounts(service):
        if container_path.startswith(target + "/"):
            return str(source / container_path.removeprefix(target + "/"))
    return container_path


@pytest.mark.parametrize("name", ["exporter-cpu", "exporter-gpu", "worker-cpu", "worker-gpu"])
def test_gpuscope_services_pass_valid_flags(name: str) -> None:
    """Each command line parses with gpuscope's own flag parser (typos fail here)."""
    service = SERVICES[name]
    command, *argv = service["command"]
    environment = {
        key: host_path(service, value) for key, value in service.get("environment", {}).items()
    }
    config_type = {"exporter": ExporterConfig, "worker": WorkerConfig}[command]
    flags.parse(config_type, argv, environment, exit_on_error=False)


def scrape_jobs() -> dict[str, list[str]]:
    """Job name -> targets of deploy/prometheus.yml."""
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    return {
        scrape["job_name"]: [t for static in scrape["static_configs"] for t in static["targets"]]
        for scrape in config["scrape_configs"]
    }


def test_scrape_jobs_are_the_ones_the_rules_select() -> None:
    """The exporter's job and the worker's, each selected by name in the rules; the
    rules' engine jobs (vLLM's, Triton's, TGI's and SGLang's own /metrics) are not part
    of the stack."""
    jobs = set(scrape_jobs())
    rules = "".join(path.read_text() for path in (REPO / "alerts" / "rules").glob("*.yml"))
    selected = set(re.findall(r'\bjob="([^"]*)"', rules))
    engine_jobs = {e.job_selector.removeprefix('job="').removesuffix('"') for e in ENGINES}
    assert jobs == {"gpuscope", "gpuscope-worker"}
    assert selected == jobs | {"vllm"} | engine_jobs


def test_scrape_targets_are_services_on_their_ports() -> None:
    """Each target is a service alias that listens on that port in every profile."""
    for job, job_targets in scrape_jobs().items():
        for target in job_targets:
            host, port = target.split(":")
            serving = [
                service
                for name, service in SERVICES.items()
                if host == name
                or host in service.get("networks", {}).get("default", {}).get("aliases", [])
            ]
            assert serving, f"{job}: no service answers to {host}"
            for service in serving:
                assert any(p.endswith(f":{port}") for p in service.get("ports", [])), service
