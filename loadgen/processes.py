"""``gpuscope`` subcommands as child processes that are always stopped.

Each child runs in its own session (so its own process group): Ctrl-C at the terminal
reaches only the parent, which then stops the children itself, and stopping a group
also stops anything the child started. ``Children.close`` sends SIGTERM to every
group, waits, then SIGKILLs what is left; it runs on success, error and Ctrl-C alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType

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


class Children:
    def __init__(self, quiet: bool = True) -> None:
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.quiet = quiet

    def start(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuscope", *args],
            start_new_session=True,
            stdout=subprocess.DEVNULL if self.quiet else None,
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
