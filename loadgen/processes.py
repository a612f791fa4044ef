"""``gpuscope`` subcommands as child processes that are always stopped.

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
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final

import aiohttp

STOP_TIMEOUT_S = 15.0


class ChildFailed(RuntimeError):
    """A child process exited or never became ready."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
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


class Children:
    def __init__(self, quiet: bool = True) -> None:
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.quiet = quiet

    def start(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuscope", *args],
            start_new_session=True,
            stdout=subprocess.DEVNULL if self.quiet else None,
            preexec_fn=_dies_with(os.getpid()),  # sound before exec: see _dies_with
        )
        self.processes[name] = process
        return process

    def stop(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            _stop_group(name, process)

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


def _stop_group(name: str, process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(
                f"gpuscope: {name} did not stop within {STOP_TIMEOUT_S:.0f} s, killing it",
                file=sys.stderr,
            )
            process.kill()
            process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever the child left in its group


async def wait_ready(
    name: str,
    url: str,
    process: subprocess.Popen[bytes],
    stop: asyncio.Event | None = None,
    timeout_s: float = 60.0,
) -> None:
    """Poll ``url`` until it answers 200; fail early if the process dies or ``stop`` is set."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ChildFailed(f"{name} exited with status {process.returncode} while starting")
            if stop is not None and stop.is_set():
                raise ChildFailed(f"{name}: stopped before it was ready")
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)  # a child process gives no readiness event to wait on
    raise ChildFailed(f"{name} not ready at {url} after {timeout_s:.0f} s")
