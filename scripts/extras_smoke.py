"""Smoke test of one gpuscope install, run inside a fresh venv by ``check_extras.py``.

    python extras_smoke.py base|exporter|worker|loadgen|all|torch

Checks that what the install should bring works (every module of its parts imports,
its commands answer ``--help`` and serve for real on 127.0.0.1), that commands of
extras not installed say which extra to install, and that the libraries of other
extras are not there. Only the standard library and gpuscope itself are imported,
so the script runs in any of those venvs.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import importlib
import importlib.util
import pkgutil
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar

from gpuscope.contract.exporter import REQUEST_DURATION
from gpuscope.contract.gpu import UP
from gpuscope.contract.http import HEALTHZ_PATH, METRICS_PATH, TRACES_PATH

if TYPE_CHECKING:
    from gpuscope.middleware.types import ASGIApp, Message, Receive, Scope, Send

START_TIMEOUT_S = 60.0
COMMAND_TIMEOUT_S = 120.0

# Libraries only one extra brings, by import name; an install without it must lack them.
LIBRARIES = {
    "exporter": ("yaml", "bcrypt", "pynvml"),
    "worker": ("starlette", "uvicorn", "numpy"),
}
# aiohttp serves the exporter and drives loadgen; prometheus_client is in all three.
SHARED = ("aiohttp", "prometheus_client")
# Each command and the extras it needs, as ``pip install 'gpuscope[...]'`` names them.
COMMANDS = {
    "exporter": "exporter",
    "doctor": "exporter",
    "worker": "worker",
    "demo": "exporter,worker,loadgen",
    "loadgen": "loadgen",
    "tune": "exporter,worker,loadgen",
}
# Modules that need more than their extra: PyTorch for the torch backend.
NEEDS_TORCH = frozenset({"gpuscope.worker.torch_models"})


class SmokeFailure(Exception):
    """What the install lacks or does wrong."""


def gpuscope_command() -> str:
    command = shutil.which("gpuscope", path=str(Path(sys.executable).parent))
    if command is None:
        raise SmokeFailure("the install has no gpuscope command")
    return command


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [gpuscope_command(), *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def check_help(command: str) -> None:
    result = run(command, "--help")
    if result.returncode != 0 or f"usage: gpuscope {command}" not in result.stdout:
        raise SmokeFailure(f"gpuscope {command} --help: {result.returncode}\n{result.stderr}")


def check_refused(*commands: str) -> None:
    """Without its extra, a command names the extra to install instead of a traceback,
    from where gpuscope came: here a wheel file (``'gpuscope[exporter] @ file:///…whl'``),
    as the bare name would be looked up on an index gpuscope is not on."""
    for command in commands:
        result = run(command, "--help")
        hint = f"pip install 'gpuscope[{COMMANDS[command]}] @ file://"
        if result.returncode != 1 or hint not in result.stderr or "Traceback" in result.stderr:
            raise SmokeFailure(
                f"gpuscope {command} without its extra: exit {result.returncode}, "
                f"expected 1 and {hint!r}:\n{result.stderr}"
            )


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def check_absent(*names: str) -> None:
    present = [name for name in names if importable(name)]
    if present:
        raise SmokeFailure(f"installed though no extra asked for them: {', '.join(present)}")


def check_modules_import(package: str) -> None:
    """Every module of ``package`` imports (a missing dependency shows up here)."""
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        if module.name not in NEEDS_TORCH or importable("torch"):
            importlib.import_module(module.name)


@contextlib.contextmanager
def serving(args: list[str], pattern: str) -> Iterator[str]:
    """Start a gpuscope command; yield the URL its log names; SIGTERM it, expect a clean
    stop (exit 0, or uvicorn's re-raised SIGTERM) without a traceback."""
    process = subprocess.Popen(
        [gpuscope_command(), *args], stderr=subprocess.PIPE, text=True, bufsize=1
    )
    lines: queue.Queue[str] = queue.Queue()
    log: list[str] = []
    reader = threading.Thread(target=_pump, args=(process.stderr, lines))
    reader.start()
    try:
        yield _wait_for_url(lines, log, pattern)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
        reader.join(timeout=10)
    while not lines.empty():
        log.append(lines.get())
    if status not in (0, -signal.SIGTERM) or "Traceback" in "".join(log):
        raise SmokeFailure(f"gpuscope {args[0]} exited {status} on SIGTERM:\n{''.join(log)}")


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def _wait_for_url(lines: queue.Queue[str], log: list[str], pattern: str) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        log.append(line)
        found = re.search(pattern, line)
        if found:
            return found.group(1)
    raise SmokeFailure(f"no line matching {pattern!r} within {START_TIMEOUT_S} s:\n{''.join(log)}")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        text: str = response.read().decode()
        return text


# ---------------------------------------------------------------------------------------
# The middleware: one request through a wrapped ASGI app, its span sent over OTLP/HTTP.


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello", "more_body": False})


async def _one_request(app: ASGIApp) -> list[Message]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/hello",
        "raw_path": b"/hello",
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def send_one_span(traces_url: str) -> None:
    """Wrap an app, serve one request, flush its span to ``traces_url``."""
    from gpuscope.middleware import GpuscopeMiddleware, setup_tracing

    provider = setup_tracing(traces_url, "extras-smoke", set_global=False)
    app = GpuscopeMiddleware(_hello, tracer_provider=provider)
    sent = asyncio.run(_one_request(app))
    provider.shutdown()  # flushes the span
    if [message.get("status") for message in sent[:1]] != [200]:
        raise SmokeFailure(f"the wrapped app answered {sent}")


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def check_middleware_exports() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        send_one_span(f"http://127.0.0.1:{server.server_address[1]}{TRACES_PATH}")
    finally:
        server.shutdown()
        thread.join()
    if not any(b"extras-smoke" in body for body in _Collector.bodies):
        raise SmokeFailure(f"no span arrived at the collector: {_Collector.bodies!r}")


# ---------------------------------------------------------------------------------------
# One smoke per install.


def smoke_base() -> None:
    check_modules_import("gpuscope.middleware")
    check_middleware_exports()
    check_refused(*COMMANDS)
    check_absent(*LIBRARIES["exporter"], *LIBRARIES["worker"], *SHARED, "torch")


def smoke_exporter() -> None:
    check_modules_import("gpuscope.exporter")
    check_help("exporter")
    check_help("doctor")
    scenario = Path(importlib.import_module("gpuscope.exporter.gpu").__path__[0]) / "scenarios"
    args = ["exporter", "--listen", "127.0.0.1:0", "--gpu-source", "simulated"]
    args += ["--gpu-scenario", str(scenario / "demo.yaml")]
    with serving(args, r"serving on (http://\S+)") as url:
        send_one_span(url + TRACES_PATH)
        metrics = get(url + METRICS_PATH)
    for expected in (f"{UP.name}{{", f"{REQUEST_DURATION.name}_count{{"):
        if expected not in metrics:
            raise SmokeFailure(f"{expected} not in the exporter's /metrics:\n{metrics}")
    doctor = run("doctor", "--gpu-source", "simulated")
    if doctor.returncode != 0:
        raise SmokeFailure(f"gpuscope doctor: exit {doctor.returncode}\n{doctor.stderr}")
    check_refused("worker", "demo", "tune")
    check_absent(*LIBRARIES["worker"], "torch")


def smoke_worker() -> None:
    check_modules_import("gpuscope.worker")
    check_help("worker")
    args = ["worker", "--port", "0", "--device", "cpu", "--no-tracing", "--hidden-size", "32"]
    with serving(args, r"Uvicorn running on (http://\S+)") as url:
        health = get(url + HEALTHZ_PATH)
        models = get(url + "/v1/models")
    if "gpuscope-synthetic" not in models:
        raise SmokeFailure(f"/v1/models: {models} (healthz: {health})")
    check_refused("exporter", "doctor", "demo", "loadgen", "tune")
    check_absent(*LIBRARIES["exporter"], "aiohttp", "torch")


def smoke_loadgen() -> None:
    check_modules_import("gpuscope.loadgen")
    check_help("loadgen")
    check_refused("exporter", "worker", "demo", "tune")
    check_absent(*LIBRARIES["worker"], *LIBRARIES["exporter"], "torch")


def smoke_all() -> None:
    for package in ("gpuscope.middleware", "gpuscope.exporter", "gpuscope.worker"):
        check_modules_import(package)
    check_help("demo")
    result = run(
        "demo", "--exit", "--duration-s", "1", "--exporter-port", "0", "--worker-port", "0"
    )
    if result.returncode != 0 or "where the time went" not in result.stdout:
        output = result.stdout + result.stderr
        raise SmokeFailure(f"gpuscope demo: exit {result.returncode}\n{output}")
    check_absent("torch")


def smoke_torch() -> None:
    check_modules_import("gpuscope.worker")
    args = ["worker", "--port", "0", "--device", "auto", "--no-tracing", "--hidden-size", "32"]
    with serving(args, r"Uvicorn running on (http://\S+)") as url:
        get(url + HEALTHZ_PATH)
    check_absent(*LIBRARIES["exporter"], "aiohttp")


SMOKES: dict[str, Callable[[], None]] = {
    "base": smoke_base,
    "exporter": smoke_exporter,
    "worker": smoke_worker,
    "loadgen": smoke_loadgen,
    "all": smoke_all,
    "torch": smoke_torch,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in SMOKES:
        print(f"usage: extras_smoke.py {'|'.join(SMOKES)}", file=sys.stderr)
        return 2
    try:
        SMOKES[argv[0]]()
    except SmokeFailure as exc:
        print(f"FAIL [{argv[0]}] {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
