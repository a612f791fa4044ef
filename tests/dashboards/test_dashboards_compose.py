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

from gpuscope import flags
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.simulated import simulated_uuid
from gpuscope.worker.config import WorkerConfig
from pack.engines import ENGINES
from support.binaries import require_binary
from support.dashboards_json import REPO

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROVISIONING = REPO / "dashboards" / "provisioning"


# ``${NAME:-default}``: a path the environment may replace, read as its default
DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")


def bind_mounts(
    service: dict[str, Any], environ: dict[str, str] | None = None
) -> list[tuple[Path, str]]:
    """(host path, container path) of every bind mount of ``service``, a path from the
    environment as compose reads it (``environ``, else the variable's default)."""
    environ = environ or {}
    mounts = []
    for volume in service.get("volumes", []):
        volume = DEFAULTED.sub(lambda m: environ.get(m.group(1)) or m.group(2), volume)
        source, target = volume.split(":")[:2]
        if source.startswith(("./", "/")):
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


RULE_FILES = sorted((REPO / "alerts" / "rules").glob("*.yml"))


def promtool_check_config(config: Path) -> str:
    """promtool's report on ``config``; fails the test unless it passes."""
    promtool = require_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _prometheus_container(root: Path, environ: dict[str, str] | None = None) -> str:
    """The container's files laid out under ``root`` as its bind mounts place them; what
    promtool says of its config there (it also checks each rule)."""
    for source, target in bind_mounts(SERVICES["prometheus"], environ):
        destination = root / target.lstrip("/")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination)
        else:
            shutil.copy(source, destination)
    flag = next(a for a in SERVICES["prometheus"]["command"] if a.startswith("--config.file="))
    return promtool_check_config(root / flag.removeprefix("--config.file=").lstrip("/"))


def test_prometheus_config_passes_promtool_with_the_rules_as_mounted(tmp_path: Path) -> None:
    """The config must find every rule file where the container has them."""
    root = tmp_path / "container"
    report = _prometheus_container(root)
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in report, report
    for rules in RULE_FILES:
        assert f"Checking {root}/etc/alerts/rules/{rules.name}" in report, report


def test_rules_built_with_another_runbook_replace_the_shipped_ones(tmp_path: Path) -> None:
    # GPUSCOPE_RULES_DIR (documented beside the mount) puts rules built with another
    # runbook address (alerts/build.py --runbook-url) where Prometheus reads its rules
    text = COMPOSE_FILE.read_text()
    assert "alerts/build.py --runbook-url" in text and "GPUSCOPE_RULES_DIR=" in text
    mine, url = tmp_path / "my-rules", "https://wiki.example.com/gpuscope/runbook.md"
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(mine)]
    subprocess.run([*build, "--runbook-url", url], check=True, capture_output=True)
    root = tmp_path / "container"
    report = _prometheus_container(root, {"GPUSCOPE_RULES_DIR": str(mine)})
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in report, report
    mounted = (root / "etc" / "alerts" / "rules" / "alerting.yml").read_text()
    assert f"runbook_url: {url}#" in mounted
    assert mounted == (mine / "alerting.yml").read_text()


def test_prometheus_config_finds_the_rules_where_it_sits_in_the_repository() -> None:
    report = promtool_check_config(REPO / "deploy" / "prometheus.yml")
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in report, report


def test_prometheus_leaves_the_lifecycle_api_off() -> None:
    """``--web.enable-lifecycle`` would let anyone who reaches :9090 stop it (/-/quit)."""
    assert not any("lifecycle" in arg for arg in SERVICES["prometheus"]["command"])


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_healthcheck(name: str) -> None:
    """Exec form (the images need no shell), probing an HTTP endpoint, within a time."""
    check = SERVICES[name]["healthcheck"]
    assert check["test"][0] == "CMD" and len(check["test"]) > 1, check
    assert any(part.startswith("http://") for part in check["test"]), check
    assert {"interval", "timeout", "retries", "start_period"} <= set(check), check


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_services_start_once_their_dependencies_are_healthy(name: str) -> None:
    depends_on = SERVICES[name].get("depends_on", {})
    assert isinstance(depends_on, dict), f"{name}: a list only orders start-up"
    for dependency, how in depends_on.items():
        assert how == {"condition": "service_healthy"}, (name, dependency, how)
        assert "healthcheck" in SERVICES[dependency], dependency


def interpolate(text: str, environment: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` and ``${VAR:?error}`` (the forms the file uses)."""

    def value(match: re.Match[str]) -> str:
        name, operator, word = match[1], match[2], match[3]
        if environment.get(name):
            return environment[name]
        if operator == ":?":
            raise ValueError(word)
        return word if operator == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", value, text)


def grafana_environment(environment: dict[str, str]) -> dict[str, str]:
    raw = SERVICES["grafana"]["environment"]
    return {key: interpolate(str(value), environment) for key, value in raw.items()}


def test_grafana_has_no_default_password_and_no_anonymous_access() -> None:
    with pytest.raises(ValueError, match="GRAFANA_ADMIN_PASSWORD"):
        grafana_environment({})
    chosen = grafana_environment({"GRAFANA_ADMIN_PASSWORD": "s3cret"})
    assert chosen["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret"
    assert chosen["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert chosen["GF_USERS_ALLOW_SIGN_UP"] == "false"
    opened = grafana_environment({"GRAFANA_ADMIN_PASSWORD": "x", "GRAFANA_ANONYMOUS": "true"})
    assert opened["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert opened["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_tempo_runs_as_its_own_user() -> None:
    user = SERVICES["tempo"]["user"]
    assert user.split(":")[0] not in {"0", "root"}, user


def stack_hosts() -> set[str]:
    """The names services reach each other by: service names and network aliases."""
    hosts = set(SERVICES)
    for service in SERVICES.values():
        hosts |= set(service.get("networks", {}).get("default", {}).get("aliases", []))
    return hosts


def test_alertmanager_receivers_reach_the_stack_or_nothing() -> None:
    """A receiver either has no integration (Alertmanager's null receiver: listed, sent
    nowhere) or sends to a host of the stack; loopback inside Alertmanager's container
    reaches nothing."""
    config = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())
    routed = {config["route"]["receiver"]}
    routed |= {route["receiver"] for route in config["route"].get("routes", [])}
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    assert routed <= set(receivers)
    for name, receiver in receivers.items():
        for key, integrations in receiver.items():
            if not key.endswith("_configs"):
                continue
            for integration in integrations:
                url = integration.get("url", "")
                host = re.sub(r"^\w+://([^:/]+).*$", r"\1", url)
                assert host in stack_hosts(), f"receiver {name} sends to {url}"


def dotenv() -> dict[str, str]:
    lines = (REPO / ".env").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if line and not line.startswith("#")]
    return {key.strip(): value.strip() for key, value in pairs}


def active(profiles: set[str]) -> set[str]:
    """The services ``docker compose up`` starts with ``profiles`` enabled."""
    return {
        name
        for name, service in SERVICES.items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }


def test_a_plain_compose_up_starts_the_cpu_stack() -> None:
    """``.env`` names the profile ``docker compose up`` starts without ``--profile``."""
    assert dotenv()["COMPOSE_PROFILES"] == "cpu"
    assert active(set()) == {"prometheus", "alertmanager", "tempo", "grafana"}


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_each_profile_is_a_whole_stack(profile: str) -> None:
    """What a profile starts depends only on what it starts, and Prometheus's targets
    and Grafana's data sources are among them (the monitoring half alone would scrape
    names nothing answers to)."""
    names = active({profile})
    hosts = set(names)
    for name in names:
        hosts |= set(SERVICES[name].get("networks", {}).get("default", {}).get("aliases", []))
    for name in names:
        assert set(SERVICES[name].get("depends_on", {})) <= names, name
    for job_targets in scrape_jobs().values():
        assert {target.split(":")[0] for target in job_targets} <= hosts
    prometheus = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    for alerting in prometheus["alerting"]["alertmanagers"]:
        for static in alerting["static_configs"]:
            assert {target.split(":")[0] for target in static["targets"]} <= hosts
    sources = yaml.safe_load((PROVISIONING / "datasources" / "gpuscope.yml").read_text())
    for source in sources["datasources"]:
        assert re.sub(r"^http://([^:/]+).*$", r"\1", source["url"]) in hosts, source


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
    rules' engine jobs (each ENGINES row's own /metrics: vLLM's, Triton's, ...) are not
    part of the stack."""
    jobs = set(scrape_jobs())
    rules = "".join(path.read_text() for path in (REPO / "alerts" / "rules").glob("*.yml"))
    selected = set(re.findall(r'\bjob="([^"]*)"', rules))
    engine_jobs = {e.job_selector.removeprefix('job="').removesuffix('"') for e in ENGINES}
    assert jobs == {"gpuscope", "gpuscope-worker"}
    assert selected == jobs | engine_jobs


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
