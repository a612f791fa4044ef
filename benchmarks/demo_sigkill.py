"""How long ``gpuscope demo``'s children outlive a SIGKILLed demo.

Starts ``gpuscope demo`` on free ports with a long load, waits until the load has run
``--kill-after-s``, SIGKILLs the demo (its children get SIGTERM from the kernel, see
``gpuscope.children``) and times until the exporter's and the worker's pids are gone.
One line per round, then the medians::

    nice .venv/bin/python benchmarks/demo_sigkill.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path


def children_of(pid: int) -> dict[str, int]:
    """``{"exporter": pid, "worker": pid}`` of the demo ``pid``, read from /proc."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid:
            for name in ("exporter", "worker"):
                if name.encode() in command:
                    found[name] = int(entry.name)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def one_round(kill_after_s: float) -> dict[str, float]:
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpuscope", "demo", "--exporter-port", "0", "--worker-port", "0",
         "--duration-s", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )  # fmt: skip
    assert demo.stdout is not None
    for line in demo.stdout:
        if line.startswith(b"load:"):
            break
    else:
        raise SystemExit("the demo ended before its load began")
    time.sleep(kill_after_s)
    pids = children_of(demo.pid)
    assert set(pids) == {"exporter", "worker"}, pids
    killed = time.monotonic()
    os.kill(demo.pid, signal.SIGKILL)
    demo.wait()
    gone: dict[str, float] = {}
    while len(gone) < len(pids) and time.monotonic() - killed < 60:
        for name, pid in pids.items():
            if name not in gone and not alive(pid):
                gone[name] = time.monotonic() - killed
        time.sleep(0.01)
    for name, pid in pids.items():  # never leave one behind
        if name not in gone:
            os.kill(pid, signal.SIGKILL)
            gone[name] = float("inf")
    return gone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-after-s", type=float, default=3.0)
    options = parser.parse_args()
    results = []
    for number in range(options.rounds):
        gone = one_round(options.kill_after_s)
        results.append(gone)
        print(
            f"round {number + 1}: exporter gone after {gone['exporter']:.2f} s, "
            f"worker after {gone['worker']:.2f} s",
            flush=True,
        )
    for name in ("exporter", "worker"):
        print(f"median {name}: {statistics.median(r[name] for r in results):.2f} s")


if __name__ == "__main__":
    main()
