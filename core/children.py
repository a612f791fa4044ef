"""gpuscope's own commands as child processes: the exporter and the worker started on
loopback ports, waited on until ready, and always stopped.

This is the one place that starts them for ``gpuscope demo``, ``gpuscope tune``,
``scripts/gpu-check`` and the tests that need them as real processes, and the one
place that spells their command lines: ``exporter_args`` and ``worker_args`` take
settings by field name and write each field's current flag (``flags.to_argv``), so a
renamed flag follows, and a value the command would refuse fails here, in the parent.
It lives in the root package rather than in ``loadgen`` because starting and stopping
processes is not measuring, and because it needs nothing beyond the standard library:
the commands' settings modules are imported only when their arguments are built.

Each child runs in its own session (so its own process group): Ctrl-C at the terminal
reaches only the parent, which then stops the children itself, and stopping a group
also stops anything the child started. ``Children.close`` sends SIGTERM to every
group, waits, then SIGKILLs what is left; it runs on success, error and Ctrl-C alike.

A parent killed outright (SIGKILL, the OOM killer) runs none of that. On Linux each
child therefore asks the kernel, before it execs, for SIGTERM when its parent dies
(``prctl(PR_SET_PDEATHSIG)``): it then shuts down as it would on a plain SIGTERM,
within its own ``--shutdown-timeout-s``, and frees its port. That was chosen over a
watchdog thread polling the parent's pid because the kernel's signal needs no code in
the exporter or the worker, cannot be missed between two polls, and also covers a
child that hangs before it could start such a thread. Elsewhere children outlive a
killed parent, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

from gpuscope.contract import http as http_paths

T = TypeVar("T")
LOOPBACK: Final = "127.0.0.1"
READY_PATH: Final = http_paths.READYZ_PATH  # both commands answer 200 there once they serve
TRACES_PATH: Final = http_paths.TRACES_PATH  # the OTLP/HTTP path, which the exporter serves
# The simulated exporter's poll interval: twice a second, so that a load of a few
# seconds (the demo's, a tuning step's) shows on the GPU series.
SIMULATED_GPU_INTERVAL_S: Final = 0.5

STOP_TIMEOUT_S = 15.0


class ChildFailed(RuntimeError):
    """A child process exited or never became ready."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def port_taken(port: int, host: str = LOOPBACK) -> bool:
    """Whether something already listens on ``host:port`` (binding it fails)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once in the parent; None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()


def _dies_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when ``parent`` dies.

    It runs in the forked child before exec, where only async-signal-safe work is
    sound: it calls the ``prctl`` looked up beforehand and ``getppid``, and imports and
    allocates nothing of its own. The signal comes when the *thread* that forked the
    child ends, not the process: so it is asked for only from the main thread, which
    lives as long as the process does."""
    prctl = _PRCTL
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    sigterm = int(signal.SIGTERM)

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return arm


# ---------------------------------------------------------------------------------------
# Command lines, built from the commands' own settings.


def exporter_args(port: int, **settings: Any) -> list[str]:
    """``gpuscope exporter`` listening on loopback ``port``, with ``settings`` given by
    ``ExporterConfig`` field (``gpu_source="simulated"``, ``gpu_interval_s=0.5``)."""
    from gpuscope import flags
    from gpuscope.exporter.config import ExporterConfig

    return ["exporter", *flags.to_argv(ExporterConfig, listen=f"{LOOPBACK}:{port}", **settings)]


def worker_args(port: int, **settings: Any) -> list[str]:
    """``gpuscope worker`` on loopback ``port``, with ``settings`` given by
    ``WorkerConfig`` field (``otlp_endpoint=...``, ``batching="continuous"``)."""
    from gpuscope import flags
    from gpuscope.worker.config import WorkerConfig

    return ["worker", *flags.to_argv(WorkerConfig, host=LOOPBACK, port=port, **settings)]


def simulated_gpu_uuid(index: int = 0) -> str:
    """The UUID of simulated GPU ``index`` of an exporter started with
    ``gpu_source="simulated"``: what a worker reports so that its spans join that GPU."""
    from gpuscope.exporter.gpu.simulated import simulated_uuid

    return simulated_uuid(index)


# ---------------------------------------------------------------------------------------
# Processes.


@dataclass(frozen=True)
class Child:
    """A started command: its process and the loopback URL it serves on."""

    name: str
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def traces_url(self) -> str:
        """Where an exporter child takes OTLP/HTTP spans (a worker's ``otlp_endpoint``)."""
        return self.url + TRACES_PATH

    async def wait_ready(self, stop: asyncio.Event | None = None, timeout_s: float = 60.0) -> None:
        await wait_ready(self.name, self.url + READY_PATH, self.process, stop, timeout_s)

    def wait_ready_blocking(self, timeout_s: float = 60.0) -> None:
        """``wait_ready`` for code without an event loop (a test's fixture, a script)."""
        deadline = time.monotonic() + timeout_s
        while not self._answers_ready(deadline):
            time.sleep(0.1)  # a child process gives no readiness event to wait on

    def _answers_ready(self, deadline: float) -> bool:
        _check_alive(self.name, self.process)
        if time.monotonic() > deadline:
            raise ChildFailed(f"{self.name} not ready at {self.url}{READY_PATH}")
        return _answers_200(self.url + READY_PATH)


class Children:
    """The children of one run; ``close`` (or leaving the ``with`` block) stops them all.

    ``quiet`` sends their standard output to /dev/null (their errors still show); ``log``
    on a start sends both of that child's streams to a file instead."""

    def __init__(self, quiet: bool = True) -> None:
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.grace_s: dict[str, float] = {}  # a child's own wait between SIGTERM and SIGKILL
        self.quiet = quiet

    def start(
        self,
        name: str,
        args: Sequence[str],
        *,
        log: Path | None = None,
        prefix: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """``gpuscope <args>`` as ``name``; ``prefix`` goes before the interpreter
        (``("nice",)``)."""
        output: Any = subprocess.DEVNULL if self.quiet else None
        with contextlib.ExitStack() as files:
            if log is not None:
                output = files.enter_context(log.open("ab"))
            process = subprocess.Popen(
                [*prefix, sys.executable, "-m", "gpuscope", *args],
                start_new_session=True,
                stdout=output,
                stderr=subprocess.STDOUT if log is not None else None,
                preexec_fn=_dies_with(os.getpid()),  # sound before exec: see _dies_with
            )
        self.processes[name] = process
        return process

    def exporter(
        self,
        name: str = "exporter",
        *,
        port: int = 0,
        log: Path | None = None,
        prefix: Sequence[str] = (),
        **settings: Any,
    ) -> Child:
        """``gpuscope exporter`` on loopback ``port`` (0: a free one) with ``settings``
        by field name; wait for it with ``wait_ready``."""
        port = port or free_port()
        process = self.start(name, exporter_args(port, **settings), log=log, prefix=prefix)
        return Child(name, process, port)

    def simulated_exporter(self, name: str = "exporter", *, port: int = 0) -> Child:
        """The exporter that the demo, the tuner and tests run beside a worker: one
        simulated GPU (``simulated_gpu_uuid(0)``, which the worker should report),
        polled every ``SIMULATED_GPU_INTERVAL_S``, logging warnings only."""
        return self.exporter(
            name,
            port=port,
            gpu_source="simulated",
            gpu_interval_s=SIMULATED_GPU_INTERVAL_S,
            log_level="warning",
        )

    def worker(
        self,
        name: str = "worker",
        *,
        port: int = 0,
        log: Path | None = None,
        extra: Sequence[str] = (),
        **settings: Any,
    ) -> Child:
        """``gpuscope worker`` on loopback ``port`` (0: a free one) with ``settings`` by
        field name, then ``extra`` flags as written (a user's own, checked by the worker)."""
        port = port or free_port()
        process = self.start(name, [*worker_args(port, **settings), *extra], log=log)
        return Child(name, process, port)

    def start_command(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        grace_s: float = STOP_TIMEOUT_S,
    ) -> subprocess.Popen[bytes]:
        """Any program (a serving engine) as ``name``, both its streams appended to ``log``;
        ``stop`` gives its group ``grace_s`` after SIGTERM before SIGKILL. ``OSError``
        when the program cannot be run (not found, not executable)."""
        with log.open("ab") as output:
            process = subprocess.Popen(
                list(argv),
                start_new_session=True,
                stdin=subprocess.DEVNULL,  # an engine never reads the tuner's terminal
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                preexec_fn=_dies_with(os.getpid()),  # sound before exec: see _dies_with
            )
        self.processes[name] = process
        self.grace_s[name] = grace_s
        return process

    def adopt(self, name: str, args: Sequence[str], port: int) -> Child:
        """``start`` for a command line built elsewhere (and checked there) that serves
        on loopback ``port``."""
        return Child(name, self.start(name, args), port)

    def stop(self, name: str) -> None:
        process = self.processes.pop(name, None)
        grace_s = self.grace_s.pop(name, STOP_TIMEOUT_S)
        if process is not None:
            _stop_group(name, process, grace_s)

    def close(self) -> None:
        for name in list(self.processes):
            self.stop(name)

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _stop_group(
    name: str, process: subprocess.Popen[bytes], grace_s: float = STOP_TIMEOUT_S
) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            print(
                f"gpuscope: {name} did not stop within {grace_s:g} s, killing it",
                file=sys.stderr,
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the group: an engine's workers too
            process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever the child left in its group


def _check_alive(name: str, process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        raise ChildFailed(f"{name} exited with status {process.returncode} while starting")


def _answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):  # not listening yet, or not ready
        return False


async def wait_ready(
    name: str,
    url: str,
    process: subprocess.Popen[bytes],
    stop: asyncio.Event | None = None,
    timeout_s: float = 60.0,
) -> None:
    """Poll ``url`` until it answers 200; fail early if the process dies or ``stop`` is set.

    Each poll runs in a thread (the standard library's client blocks), so the event
    loop keeps serving the stop signals meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _check_alive(name, process)
        if stop is not None and stop.is_set():
            raise ChildFailed(f"{name}: stopped before it was ready")
        if await asyncio.to_thread(_answers_200, url):
            return
        await asyncio.sleep(0.1)  # a child process gives no readiness event to wait on
    raise ChildFailed(f"{name} not ready at {url} after {timeout_s:.0f} s")


# ---------------------------------------------------------------------------------------
# Running until a stop signal.

# Ctrl-C, and how a supervisor (kill, timeout, make, systemd) or a closed terminal asks
# to stop: each ends the run cleanly, so the processes it started never outlive it.
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_until_stopped(
    make: Callable[[asyncio.Event], Coroutine[Any, Any, T]],
) -> tuple[T, bool]:
    """Run ``make(stop)``; SIGINT, SIGTERM or SIGHUP sets ``stop`` instead of ending the
    process. Returns (result, stopped)."""

    async def main() -> tuple[T, bool]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for stop_signal in STOP_SIGNALS:
            loop.add_signal_handler(stop_signal, stop.set)
        try:
            return await make(stop), stop.is_set()
        finally:
            for stop_signal in STOP_SIGNALS:
                loop.remove_signal_handler(stop_signal)

    return asyncio.run(main())
