"""Each gpuscope service of docker-compose.yml run the way its container runs it, without
Docker: its entrypoint and command (the Dockerfile's where the service sets none), in a
working directory laid out as the image's (``WORKDIR`` holding what the Dockerfile
copies), with its environment, mounted paths read from the checkout, and every address
rebound to a free loopback port. The CPU profile is brought up in dependency order and
must serve, and put load on the worker; every service's subcommand must answer
``--help``. (The load service once imported a module that no longer existed, and the
CPU stack ran with no load while the compose file still validated.)"""

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
from support.dashboards_json import REPO

COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
# The services built from the repository's Dockerfile (the others are third-party images).
GPUSCOPE_SERVICES = sorted(name for name, service in SERVICES.items() if "build" in service)
# What the image's PATH resolves each executable to here.
EXECUTABLES = {"gpuscope": str(Path(sys.executable).parent / "gpuscope"), "python": sys.executable}
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


def host_path(service: dict[str, Any], text: str) -> str:
    """``text`` with a container path of a bind mount of ``service`` made the host's."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./") and text.startswith(target):
            return str(REPO / source) + text.removeprefix(target)
    return text


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
    entrypoint = service.get("entrypoint", dockerfile_json("ENTRYPOINT"))
    command = service.get("command", dockerfile_json("CMD"))
    argv = [*entrypoint, *command]
    assert argv[0] in EXECUTABLES, f"{name} runs {argv[0]!r}, which the image does not hold"
    return argv


def host_command(name: str, ports: Ports) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run service ``name`` here."""
    service = SERVICES[name]
    hosts = stack_hosts()
    executable, *args = container_argv(name)
    argv = [EXECUTABLES[executable]]
    argv += [ports.rebind(host_path(service, arg), hosts) for arg in args]
    environment = {"PATH": str(Path(sys.executable).parent), "PYTHONUNBUFFERED": "1"}
    for key, value in service.get("environment", {}).items():
        environment[key] = ports.rebind(host_path(service, str(value)), hosts)
    twin = DEFAULT_PORT_TWIN.get(args[0] if args else "")
    for port in published(service):
        if twin is not None and str(port) not in " ".join(args):
            environment[twin] = str(ports[port])
    return argv, environment


@dataclass
class Running:
    name: str
    process: subprocess.Popen[str]

    def output(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.read()


@contextmanager
def started(names: Sequence[str], workdir: Path, ports: Ports) -> Iterator[list[Running]]:
    """Each service started once the services it depends on answer (the third-party
    ones, Tempo, are not run: the exporter's forwarding to it fails quietly)."""
    running: list[Running] = []
    try:
        for name in names:
            for dependency in SERVICES[name].get("depends_on", []):
                if dependency in GPUSCOPE_SERVICES:  # third-party ones are not run here
                    assert dependency in names[: names.index(name)], f"{name} needs {dependency}"
            argv, environment = host_command(name, ports)
            process = subprocess.Popen(
                argv, cwd=workdir, env=environment, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            running.append(Running(name, process))
            for port in published(SERVICES[name]):
                wait_until_ready(running[-1], ports[port])
        yield running
    finally:
        for service in reversed(running):
            if service.process.poll() is None:
                service.process.kill()
            service.process.communicate(timeout=30)


def wait_until_ready(service: Running, port: int, timeout_s: float = 60) -> None:
    """``/readyz`` answers 200 on ``port`` (the published one: proof it listens there)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            pytest.fail(f"{service.name} exited {service.process.returncode}:\n{service.output()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # another process gives no readiness event to wait on
    pytest.fail(f"{service.name} not ready on its published port within {timeout_s:.0f} s")


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
    assert "c=8 (stopped)" in report, report
    assert "Traceback" not in report


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
