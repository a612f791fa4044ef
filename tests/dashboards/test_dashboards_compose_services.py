"""Services of docker-compose.yml run the way their containers run them, without Docker:
the entrypoint and command (the Dockerfile's where a gpuscope service sets none; the
image's binary for Prometheus and Alertmanager, installed here from Debian), in a
working directory laid out as the image's (``WORKDIR`` holding what the Dockerfile
copies), with the service's environment, mounted paths read from the checkout, named
volumes in a temporary folder, and every address rebound to a free loopback port. Each
service is started once those it depends on pass their healthchecks, and its own
healthcheck command (the same argv, the executable resolved here) must fail before it
runs and pass once it serves, as Docker's ``service_healthy`` waits for. The CPU
profile must serve and put load on the worker; every gpuscope subcommand must answer
``--help``. (The load service once imported a module that no longer existed, and the
CPU stack ran with no load while the compose file still validated.) Tempo and Grafana
have no binary here: their files are checked in ``test_dashboards_compose``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpuscope.children import free_port
from support.binaries import require_binary
from support.dashboards_json import REPO

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
# The services built from the repository's Dockerfile (the others are third-party images).
GPUSCOPE_SERVICES = sorted(name for name, service in SERVICES.items() if "build" in service)
# What the image's PATH resolves each executable to here.
EXECUTABLES = {"gpuscope": str(Path(sys.executable).parent / "gpuscope"), "python": sys.executable}
# The third-party images' entrypoints, and the binary (a Debian package's) that runs
# each here. The busybox wget of those images shares the options the probes use with
# GNU wget.
IMAGE_ENTRYPOINTS = {"prom/prometheus": "prometheus", "prom/alertmanager": "alertmanager"}
THIRD_PARTY_BINARIES = {
    "prometheus": "prometheus",
    "alertmanager": "prometheus-alertmanager",
    "wget": "wget",
}
# A service that publishes a port without naming it on its command line listens on its
# default, which is moved with the flag's environment twin.
DEFAULT_PORT_TWIN = {"worker": "GPUSCOPE_PORT"}


def dockerfile_json(instruction: str) -> list[str]:
    found = re.search(rf"^{instruction} (\[.*\])$", DOCKERFILE, re.MULTILINE)
    assert found is not None, f"the Dockerfile has no {instruction} in exec form"
    value: list[str] = json.loads(found.group(1))
    return value


def image_layout(root: Path) -> Path:
    """The image's working directory under ``root``: the last ``WORKDIR``, with what the
    ``COPY`` lines put under the ``WORKDIR`` in force when they ran."""
    workdir: str | None = None
    for line in DOCKERFILE.splitlines():
        if line.startswith("WORKDIR "):
            workdir = line.split(maxsplit=1)[1]
            (root / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif line.startswith("COPY "):
            assert workdir is not None
            *sources, target = line.split()[1:]
            for source in sources:
                destination = root / workdir.lstrip("/") / target / Path(source).name
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.symlink_to(REPO / source)
    assert workdir is not None
    return root / workdir.lstrip("/")


def host_path(service: dict[str, Any], text: str, volumes: Path | None = None) -> str:
    """``text`` with a container path of a bind mount of ``service`` made the host's, and
    one of a named volume a folder of ``volumes`` (when given)."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        found = re.search(rf"(^|=){re.escape(target)}(/|$)", text)
        if found is None:
            continue
        if source.startswith("./"):
            return text.replace(target, str(REPO / source), 1)
        if volumes is not None:
            (volumes / source).mkdir(parents=True, exist_ok=True)
            return text.replace(target, str(volumes / source), 1)
    return text


def executable(name: str) -> str:
    """The binary here that stands for the container's executable ``name``."""
    if name in EXECUTABLES:
        return EXECUTABLES[name]
    assert name in THIRD_PARTY_BINARIES, f"no stand-in here for the image's {name!r}"
    return require_binary(THIRD_PARTY_BINARIES[name])


@dataclass
class Ports:
    """Container ports of the stack, each moved to a free loopback port here."""

    moved: dict[int, int]

    def __getitem__(self, port: int) -> int:
        return self.moved.setdefault(port, free_port())

    def rebind(self, text: str, hosts: set[str]) -> str:
        """Addresses of the stack in ``text`` made loopback ones."""
        text = text.replace("0.0.0.0", "127.0.0.1")
        text = re.sub(
            r"^(--listen=)[^:]*:(\d+)$", lambda m: f"{m[1]}127.0.0.1:{self[int(m[2])]}", text
        )
        text = re.sub(r"^(--port=)(\d+)$", lambda m: f"{m[1]}{self[int(m[2])]}", text)
        return re.sub(
            r"//([\w.-]+):(\d+)",
            lambda m: f"//127.0.0.1:{self[int(m[2])]}" if m[1] in hosts else m[0],
            text,
        )


def published(service: dict[str, Any]) -> list[int]:
    """The container ports ``service`` publishes (``127.0.0.1:HOST:CONTAINER``)."""
    return [int(port.rsplit(":", 1)[1]) for port in service.get("ports", [])]


def stack_hosts() -> set[str]:
    """The names other services reach a service by: its name and its aliases."""
    hosts = set(SERVICES)
    for service in SERVICES.values():
        hosts |= set(service.get("networks", {}).get("default", {}).get("aliases", []))
    return hosts


def container_argv(name: str) -> list[str]:
    """What the container executes: entrypoint + command, the image's where unset."""
    service = SERVICES[name]
    if "build" in service:
        entrypoint = service.get("entrypoint", dockerfile_json("ENTRYPOINT"))
        command = service.get("command", dockerfile_json("CMD"))
        argv = [*entrypoint, *command]
        assert argv[0] in EXECUTABLES, f"{name} runs {argv[0]!r}, which the image does not hold"
        return argv
    image = service["image"].rpartition(":")[0]
    assert "entrypoint" not in service and image in IMAGE_ENTRYPOINTS, image
    return [IMAGE_ENTRYPOINTS[image], *service["command"]]


def host_command(
    name: str, ports: Ports, volumes: Path | None = None
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run service ``name`` here."""
    service = SERVICES[name]
    hosts = stack_hosts()
    program, *args = container_argv(name)
    argv = [executable(program)]
    argv += [ports.rebind(host_path(service, arg, volumes), hosts) for arg in args]
    if "build" not in service:
        # Prometheus and Alertmanager listen on their default port in the container
        (port,) = published(service)
        argv.append(f"--web.listen-address=127.0.0.1:{ports[port]}")
    environment = {"PATH": str(Path(sys.executable).parent), "PYTHONUNBUFFERED": "1"}
    for key, value in service.get("environment", {}).items():
        environment[key] = ports.rebind(host_path(service, str(value)), hosts)
    twin = DEFAULT_PORT_TWIN.get(args[0] if args else "")
    for port in published(service):
        if twin is not None and str(port) not in " ".join(args):
            environment[twin] = str(ports[port])
    return argv, environment


def healthcheck_argv(name: str, ports: Ports) -> list[str]:
    """The service's healthcheck command as it runs here: inside the container,
    127.0.0.1 is the service itself, whose ports are moved like the others."""
    program, *args = SERVICES[name]["healthcheck"]["test"][1:]
    hosts = stack_hosts() | {"127.0.0.1", "localhost"}
    return [executable(program), *(ports.rebind(arg, hosts) for arg in args)]


def probes_itself(name: str) -> bool:
    """Whether the healthcheck asks the service's own container (127.0.0.1)."""
    return any("//127.0.0.1:" in arg for arg in SERVICES[name]["healthcheck"]["test"])


def healthy(name: str, ports: Ports, cwd: Path) -> bool:
    """One healthcheck, with the service's own timeout."""
    timeout_s = float(SERVICES[name]["healthcheck"]["timeout"].removesuffix("s"))
    try:
        done = subprocess.run(
            healthcheck_argv(name, ports), cwd=cwd, capture_output=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


@dataclass
class Running:
    name: str
    process: subprocess.Popen[str]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


# Run elsewhere, or not at all: Tempo has no binary here (the exporter's forwarding to it
# fails quietly), and a gpuscope service may need Prometheus's side of the stack.
NOT_RUN_HERE = {"tempo", "grafana"}


@contextmanager
def started(names: Sequence[str], workdir: Path, ports: Ports) -> Iterator[list[Running]]:
    """Each service started once the services it depends on pass their healthchecks
    (those not run here excepted), and returned once its own passes."""
    running: list[Running] = []
    volumes = workdir.parent / "volumes"
    try:
        for name in names:
            for dependency in SERVICES[name].get("depends_on", {}):
                if dependency not in NOT_RUN_HERE:
                    assert dependency in names[: names.index(name)], f"{name} needs {dependency}"
            if probes_itself(name):  # the load's probe asks its worker, already up
                assert not healthy(name, ports, workdir), f"{name} healthy before it started"
            argv, environment = host_command(name, ports, volumes)
            log = workdir.parent / f"{name}.log"
            with log.open("w") as output:
                process = subprocess.Popen(
                    argv, cwd=workdir, env=environment, text=True,
                    stdout=output, stderr=subprocess.STDOUT,
                )  # fmt: skip
            running.append(Running(name, process, log))
            wait_until_healthy(running[-1], ports, workdir)
        yield running
    finally:
        for service in reversed(running):
            if service.process.poll() is None:
                service.process.kill()
            service.process.wait(timeout=30)


def wait_until_healthy(service: Running, ports: Ports, cwd: Path, timeout_s: float = 60) -> None:
    """Its healthcheck passes, as Docker's ``service_healthy`` waits for (probed more
    often than the compose file's interval: another process gives no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            pytest.fail(f"{service.name} exited {service.process.returncode}:\n{service.output()}")
        if healthy(service.name, ports, cwd):
            return
        time.sleep(0.2)
    pytest.fail(f"{service.name} failed its healthcheck for {timeout_s:.0f} s:\n{service.output()}")


def requests_served(port: int) -> int:
    counters = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
    return sum(
        int(part.get("completed", 0)) for part in counters.values() if isinstance(part, dict)
    )


def test_the_cpu_profile_serves_and_its_load_reaches_the_worker(tmp_path: Path) -> None:
    cpu = [name for name in SERVICES if "cpu" in SERVICES[name].get("profiles", [])]
    assert set(cpu) <= set(GPUSCOPE_SERVICES) and cpu == ["exporter-cpu", "worker-cpu", "load"]
    ports = Ports({})
    with started(cpu, image_layout(tmp_path), ports) as running:
        exporter, worker, load = running
        deadline = time.monotonic() + 120
        while requests_served(ports[8000]) < 5:  # the load service's requests
            assert load.process.poll() is None, load.output()
            assert time.monotonic() < deadline, "the load service sent nothing"
            time.sleep(0.2)  # another process's progress gives no event to wait on
        load.process.send_signal(signal.SIGTERM)
        assert load.process.wait(60) == 130  # stopped: it reports what it measured
        report = load.output()
        for service in (worker, exporter):
            service.process.send_signal(signal.SIGTERM)
            assert service.process.wait(60) == 0, service.output()
        # a stopped service fails its healthcheck (the load's follows its worker)
        for service in running:
            assert not healthy(service.name, ports, tmp_path), service.name
    assert "c=8 (stopped)" in report, report
    assert "Traceback" not in report


def test_prometheus_and_alertmanager_run_as_their_containers_and_pass_their_healthchecks(
    tmp_path: Path,
) -> None:
    """Alertmanager, then Prometheus (which waits for it), with the compose command, the
    mounted configuration and rules: both healthy, every rule group of the mounted rule
    files loaded, and Alertmanager's receivers the shipped ones."""
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    ports = Ports({})
    with started(["alertmanager", "prometheus"], workdir, ports):
        rules = httpx.get(f"http://127.0.0.1:{ports[9090]}/api/v1/rules", timeout=10).json()
        status = httpx.get(f"http://127.0.0.1:{ports[9093]}/api/v2/status", timeout=10).json()
    loaded = {group["name"] for group in rules["data"]["groups"]}
    shipped = {
        group["name"]
        for path in (REPO / "alerts" / "rules").glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
    }
    assert loaded == shipped
    receivers = yaml.safe_load(status["config"]["original"])["receivers"]
    assert sorted(receiver["name"] for receiver in receivers) == ["page", "ticket"]
    assert (tmp_path / "volumes" / "prometheus-data").is_dir()  # the named volume used


@pytest.mark.parametrize("name", GPUSCOPE_SERVICES)
def test_every_gpuscope_service_command_answers_help(name: str, tmp_path: Path) -> None:
    """The GPU profile cannot run here (NVML, CUDA): its subcommands must at least exist
    in the image and parse; ``test_gpuscope_services_pass_valid_flags`` checks the flags."""
    argv, environment = host_command(name, Ports({}))
    executable, subcommand = argv[0], argv[1]
    assert executable == EXECUTABLES["gpuscope"], f"{name} does not run gpuscope"
    done = subprocess.run(
        [executable, subcommand, "--help"], cwd=image_layout(tmp_path), env=environment,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: gpuscope {subcommand}")
