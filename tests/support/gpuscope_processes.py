"""The live ``python -m gpuscope ...`` processes of this interpreter: what a test of a
command that starts children (``tune``, ``demo``) compares before and after, so that no
exporter or worker it started outlives it.

Under ``pytest -n`` (xdist) the other workers start such processes too; each inherits
its worker's ``PYTEST_XDIST_WORKER``, so only this worker's (the variable's value, or its
absence outside xdist) are counted, and a test that kills what its command left behind
never kills another test's. An orphan keeps its environment when its parent is gone."""

from __future__ import annotations

import os
import sys
from pathlib import Path

GPUSCOPE = [sys.executable, "-m", "gpuscope"]
WORKER_VARIABLE = "PYTEST_XDIST_WORKER"


def _worker_of(environment: list[bytes]) -> str | None:
    prefix = f"{WORKER_VARIABLE}=".encode()
    for item in environment:
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def gpuscope_processes() -> set[int]:
    """Live ``python -m gpuscope ...`` processes of this interpreter."""
    pids = set()
    worker = os.environ.get(WORKER_VARIABLE)  # read now: xdist sets it in its workers
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        if [a.decode(errors="replace") for a in argv[:3]] != GPUSCOPE:
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if _worker_of(environment) == worker:
            pids.add(int(entry.name))
    return pids
