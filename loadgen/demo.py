"""``gpuscope demo``: exporter + worker + a short load on 127.0.0.1, then a report.

Starts ``gpuscope exporter`` with a simulated GPU and ``gpuscope worker`` told that
GPU's UUID and sending its spans to the exporter, as child processes; puts a mix of
embedding and streamed completion requests on the worker; then prints where the
time went (client-side percentiles, the exporter's per-phase breakdown and what the
simulated GPU saw) and, unless ``--exit``, keeps both running for Prometheus to scrape
until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import httpx

from gpuscope import flags
from gpuscope.loadgen.report import LoadResult, format_report, run_load, scrape_summary

ENV_PREFIX = "GPUSCOPE_DEMO_"
BATCHING = ("none", "static", "dynamic", "continuous")


@dataclass(frozen=True)
class DemoOptions:
    duration_s: float = 10.0
    concurrency: int = 16
    batching: str = "dynamic"
    exporter_port: int = 9420
    worker_port: int = 8000
    exit: bool = False

    def __post_init__(self) -> None:
        flags.check_positive("--duration-s", self.duration_s)
        flags.check_range("--concurrency", self.concurrency, 1)
        flags.check_choice("--batching", self.batching, BATCHING)
        flags.check_range("--exporter-port", self.exporter_port, 0, 65535)
        flags.check_range("--worker-port", self.worker_port, 0, 65535)

    @property
    def keep_running(self) -> bool:
        return not self.exit


_HELP = {
    "duration_s": "seconds of load",
    "concurrency": "concurrent clients",
    "batching": "the worker's batching strategy: " + ", ".join(BATCHING),
    "exporter_port": "exporter port on 127.0.0.1 (0: any free port)",
    "worker_port": "worker port on 127.0.0.1 (0: any free port)",
    "exit": "stop both processes after the report instead of serving on",
}


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> DemoOptions:
    parser = flags.build_parser(
        DemoOptions,
        prog="gpuscope demo",
        description="Start the exporter (simulated GPU) and the worker on 127.0.0.1, put a "
        "short load on them and report where the time went. Every flag has a "
        f"{ENV_PREFIX}* environment twin.",
        help=_HELP,
        env_prefix=ENV_PREFIX,
    )
    options = flags.parse_or_exit(DemoOptions, parser, argv, environ, ENV_PREFIX)
    # Port 0 means any free port: pick it here, the child processes need to be told.
    return replace(
        options,
        exporter_port=options.exporter_port or free_port(),
        worker_port=options.worker_port or free_port(),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def child(name: str, args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A ``gpuscope`` subcommand as a child process, terminated (then killed) on exit."""
    process = subprocess.Popen([sys.executable, "-m", "gpuscope", *args])
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            print(f"gpuscope demo: {name} did not stop within 15 s, killing it", file=sys.stderr)
            process.kill()
            process.wait()


def wait_ready(
    name: str, url: str, process: subprocess.Popen[bytes], timeout_s: float = 60
) -> None:
    """Poll ``url`` until it answers 200; fail early if the process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with status {process.returncode} while starting")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)  # a child process gives no readiness event to wait on
    raise RuntimeError(f"{name} not ready at {url} after {timeout_s:.0f} s")


def run_demo(options: DemoOptions) -> tuple[LoadResult, str]:
    from gpuscope.exporter.gpu.simulated import simulated_uuid

    exporter_url = f"http://127.0.0.1:{options.exporter_port}"
    worker_url = f"http://127.0.0.1:{options.worker_port}"
    exporter_args = [
        "exporter",
        "--listen",
        f"127.0.0.1:{options.exporter_port}",
        "--gpu-source",
        "simulated",
        "--gpu-interval-s",
        "0.5",
        "--log-level",
        "warning",
    ]
    worker_args = [
        "worker",
        "--host",
        "127.0.0.1",
        "--port",
        str(options.worker_port),
        "--batching",
        options.batching,
        "--gpu-uuid",
        simulated_uuid(0),
        "--otlp-endpoint",
        f"{exporter_url}/v1/traces",
        "--log-level",
        "warning",
    ]
    with child("exporter", exporter_args) as exporter, child("worker", worker_args) as worker:
        wait_ready("exporter", f"{exporter_url}/readyz", exporter)
        wait_ready("worker", f"{worker_url}/readyz", worker)
        print(f"exporter: {exporter_url}/metrics   worker: {worker_url}/v1 (OpenAI-compatible)")
        print(
            f"load: {options.concurrency} clients for {options.duration_s:g} s, "
            f"batching={options.batching} ...",
            flush=True,
        )
        result = asyncio.run(run_load(worker_url, options.duration_s, options.concurrency))
        summary = asyncio.run(scrape_summary(exporter_url, expected_requests=result.completed))
        report = format_report(result, summary)
        print(report, flush=True)
        if options.keep_running:
            print("serving on; point Prometheus at the exporter. Ctrl-C stops both.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                worker.wait()
        return result, report


def main(argv: Sequence[str]) -> int:
    options = parse_args(argv)
    try:
        result, _ = run_demo(options)
    except RuntimeError as exc:
        print(f"gpuscope demo: {exc}", file=sys.stderr)
        return 1
    return 0 if result.completed > 0 else 1
