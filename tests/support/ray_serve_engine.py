"""A real Ray Serve deployment (``ray[serve]`` in its own venv) for ``make ray-check``.

``make ray-check`` creates that venv (``.venv-ray``, gpuscope installed in it) and points
``GPUSCOPE_RAY_PYTHON`` at its interpreter; without it the live Ray Serve tests are
skipped. The deployment is ``scripts/engines/ray_serve_app.py``'s, run with that
interpreter under ``nice``: Ray on the shared 2-core machine is kept to two CPUs, no
dashboard, and a temporary folder of its own, which this module checks is left
without a running process when the app has stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON_VARIABLE = "GPUSCOPE_RAY_PYTHON"
APP = REPO / "scripts" / "engines" / "ray_serve_app.py"
READY_TIMEOUT_S = 300.0  # a few seconds when idle; much more on a loaded machine
STOP_TIMEOUT_S = 60.0


def ray_python() -> Path | None:
    """The Ray venv's interpreter from ``GPUSCOPE_RAY_PYTHON``, or None."""
    value = os.environ.get(PYTHON_VARIABLE)
    return Path(value).absolute() if value else None  # absolute, not resolved: a venv links


@dataclass
class RayServeApp:
    process: subprocess.Popen[bytes]
    url: str
    metrics_url: str  # Ray's own Prometheus metrics (ray_serve_*)
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): tells a pid reused apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def process_tree(root: int) -> dict[int, str]:
    """``root`` and every descendant, each with its start time."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree: dict[int, str] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        started = _start_time(pid)
        if started is not None:
            tree[pid] = started
            pending.extend(children.get(pid, ()))
    return tree


def still_running(tree: dict[int, str]) -> list[int]:
    """The processes of ``tree`` that are still the same processes and not zombies."""
    running = []
    for pid, started in tree.items():
        if _start_time(pid) != started:
            continue
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.append(pid)
    return running


@contextmanager
def ray_serve_app(
    python: Path,
    work: Path,
    ports: tuple[int, int],
    traces_endpoint: str,
    replicas: int = 2,
) -> Iterator[RayServeApp]:
    """Start the app (HTTP on ``ports[0]``, Ray's metrics on ``ports[1]``), yield once it
    printed READY, then stop it and check that every process Ray started is gone."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "app.log"
    ray_temp = work / "ray"
    port, metrics_port = ports
    command = [
        "nice",
        str(python),
        str(APP),
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--traces-endpoint",
        traces_endpoint,
        "--work",
        str(ray_temp),
        "--replicas",
        str(replicas),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=work,
            # Ray's workers report their metrics every 10 s by default; the check waits less.
            env={**os.environ, "RAY_metrics_report_interval_ms": "1000"},
        )
    app = RayServeApp(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}", log)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "READY " not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray Serve did not start:\n{app.log_tail()}")
            time.sleep(0.5)
        yield app
    finally:
        # Ray renames its workers (ray::ServeReplica...), so they are found by parentage,
        # before the app stops and they lose their parent.
        tree = process_tree(process.pid)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        _reap(tree)


def _reap(tree: dict[int, str]) -> None:
    """The app's shutdown stops every process Ray started; wait for that, then end any
    straggler by its pid (each one this test's own: a descendant of the app)."""
    deadline = time.monotonic() + 30
    while (left := still_running(tree)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        raise AssertionError(f"Ray left {len(left)} processes running after shutdown: {left}")
