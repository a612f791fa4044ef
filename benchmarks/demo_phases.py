"""The demo's phase quantiles, as Prometheus would compute them from the exporter.

Runs ``gpuscope demo`` (its default load unless told otherwise) for ``--duration-s``,
scrapes the exporter once the report is printed, and gives per phase the request
count, P50 and P99 (``histogram_quantile``'s interpolation, from the summed buckets)
and the share of requests above ``--over-ms``. This is how docs/worker.md's batch-wait
figures were read: run it with ``--repeats`` and read the median and spread.

    nice python benchmarks/demo_phases.py [--duration-s 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from gpuscope.contract import exporter as exporter_rows
from gpuscope.contract.http import METRICS_PATH
from gpuscope.loadgen.server_view import parse_sample
from gpuscope.loadgen.stats import histogram_quantile

GPUSCOPE = Path(sys.executable).with_name("gpuscope")
PHASE_BUCKET = exporter_rows.REQUEST_PHASE.name + "_bucket"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def phase_buckets(metrics: str) -> dict[str, dict[float, float]]:
    """Phase -> {upper bound: cumulative count}, summed over every label set."""
    buckets: defaultdict[str, defaultdict[float, float]] = defaultdict(lambda: defaultdict(float))
    for line in metrics.splitlines():
        if line.startswith(PHASE_BUCKET + "{"):
            _, labels, value = parse_sample(line)
            buckets[labels["phase"]][float(labels["le"])] += value
    return {phase: dict(counts) for phase, counts in buckets.items()}


def share_over(cumulative: dict[float, float], bound_s: float) -> float:
    """Share of observations above ``bound_s`` (which must be a bucket bound)."""
    total = cumulative[math.inf]
    return 1 - cumulative[bound_s] / total if total else 0.0


def run_demo(duration_s: float, extra: Sequence[str]) -> str:
    """One demo run; the exporter's /metrics once its report is out."""
    exporter_port, worker_port = free_port(), free_port()
    argv = [str(GPUSCOPE), "demo", "--duration-s", f"{duration_s:g}"]
    argv += ["--exporter-port", str(exporter_port), "--worker-port", str(worker_port), *extra]
    demo = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if line.startswith("serving on"):
                break
        else:
            raise SystemExit(f"demo ended before its report (exit {demo.wait()})")
        url = f"http://127.0.0.1:{exporter_port}{METRICS_PATH}"
        with urllib.request.urlopen(url, timeout=30) as response:
            return str(response.read().decode())
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(30)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=60.0, help="load per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs, reported as median")
    parser.add_argument("--over-ms", type=float, default=10.0, help="a bucket bound, in ms")
    parser.add_argument("demo_args", nargs="*", help="more `gpuscope demo` flags, after --")
    args = parser.parse_args(argv)
    runs: defaultdict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    for _ in range(args.repeats):
        for phase, cumulative in phase_buckets(run_demo(args.duration_s, args.demo_args)).items():
            p50, p99 = histogram_quantile(0.5, cumulative), histogram_quantile(0.99, cumulative)
            if p50 is None or p99 is None:
                continue
            over = share_over(cumulative, args.over_ms / 1000)
            runs[phase].append((cumulative[math.inf], p50 * 1000, p99 * 1000, over))
    for phase, rows in sorted(runs.items()):
        n, p50, p99, over = (statistics.median(column) for column in zip(*rows, strict=True))
        spread = f"{min(r[2] for r in rows):.1f}-{max(r[2] for r in rows):.1f}"
        print(
            f"{phase:12} n={n:.0f} p50={p50:.2f} ms p99={p99:.2f} ms (runs {spread}) "
            f"over {args.over_ms:g} ms: {over:.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
