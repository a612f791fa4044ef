"""The live ``python -m gpuscope ...`` processes of this interpreter: what a test of a
command that starts children (``tune``, ``demo``) compares before and after, so that no
exporter or worker it started outlives it."""

from __future__ import annotations

import sys
from pathlib import Path

GPUSCOPE = [sys.executable, "-m", "gpuscope"]


def gpuscope_processes() -> set[int]:
    """Live ``python -m gpuscope ...`` processes of this interpreter."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        if [a.decode(errors="replace") for a in argv[:3]] == GPUSCOPE:
            pids.add(int(entry.name))
    return pids
