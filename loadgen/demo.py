"""``gpuscope demo``: exporter + worker + a short load on 127.0.0.1, then a report.

Starts ``gpuscope exporter`` with a simulated GPU and ``gpuscope worker`` told that
GPU's UUID and sending its spans to the exporter, as child processes; runs one
``gpuscope loadgen`` step (embeddings and streamed completions) against them; prints
the client's percentiles next to the exporter's phase breakdown and what the simulated
GPU saw; unless ``--exit``, keeps both running for Prometheus to scrape until Ctrl-C.

It refuses to start when either port is already taken (it would otherwise measure
whatever listens there) and exits non-zero when anything fails: a child that does not
start, a failed request, or an exporter that did not count the requests.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpuscope import flags
from gpuscope.loadgen import record
from gpuscope.loadgen.cli import run_with_ctrl_c
from gpuscope.loadgen.output import table
from gpuscope.loadgen.processes import ChildFailed, Children, free_port, port_taken, wait_ready
from gpuscope.loadgen.results import Load, StepResult
from gpuscope.loadgen.runner import Plan, Runner, Target
from gpuscope.loadgen.workload import Lengths, synthetic_requests
from gpuscope.worker.config import BatchingMode, batching_mode

ENV_PREFIX = "GPUSCOPE_DEMO_"
MIX = {"embeddings": 1.0, "completions-stream": 1.0}


@dataclass(frozen=True)
class DemoOptions:
    duration_s: float = 10.0
    concurrency: int = 16
    batching: BatchingMode = BatchingMode.DYNAMIC
    exporter_port: int = 9420
    worker_port: int = 8000
    exit: bool = False

    def __post_init__(self) -> None:
        flags.check_positive("--duration-s", self.duration_s)
        flags.check_range("--concurrency", self.concurrency, 1)
        object.__setattr__(self, "batching", batching_mode(self.batching))
        flags.check_range("--exporter-port", self.exporter_port, 0, 65535)
        flags.check_range("--worker-port", self.worker_port, 0, 65535)

    @property
    def keep_running(self) -> bool:
        return not self.exit


_HELP = {
    "duration_s": "seconds of load",
    "concurrency": "concurrent clients",
    "batching": "the worker's batching strategy: " + ", ".join(BatchingMode),
    "exporter_port": "exporter port on 127.0.0.1 (0: any free port)",
    "worker_port": "worker port on 127.0.0.1 (0: any free port)",
    "exit": "stop both processes after the report instead of serving on",
}


class DemoFailed(RuntimeError):
    pass


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


def check_ports(options: DemoOptions) -> None:
    for name, flag, port in (
        ("exporter", "--exporter-port", options.exporter_port),
        ("worker", "--worker-port", options.worker_port),
    ):
        if port_taken(port):
            raise DemoFailed(
                f"127.0.0.1:{port} is already in use, so the {name} cannot listen there "
                f"(is another demo, worker or exporter running?); stop it or pass {flag} 0"
            )


def _child_args(options: DemoOptions) -> tuple[list[str], list[str]]:
    from gpuscope.exporter.gpu.simulated import simulated_uuid

    exporter = ["exporter", "--listen", f"127.0.0.1:{options.exporter_port}"]
    exporter += ["--gpu-source", "simulated", "--gpu-interval-s", "0.5", "--log-level", "warning"]
    worker = ["worker", "--host", "127.0.0.1", "--port", str(options.worker_port)]
    worker += ["--batching", options.batching, "--gpu-uuid", simulated_uuid(0)]
    worker += ["--otlp-endpoint", f"http://127.0.0.1:{options.exporter_port}/v1/traces"]
    return exporter, [*worker, "--log-level", "warning"]


async def _demo(options: DemoOptions, children: Children, stop: asyncio.Event) -> StepResult:
    exporter_url = f"http://127.0.0.1:{options.exporter_port}"
    worker_url = f"http://127.0.0.1:{options.worker_port}"
    exporter_args, worker_args = _child_args(options)
    exporter = children.start("exporter", exporter_args)
    worker = children.start("worker", worker_args)
    await wait_ready("exporter", f"{exporter_url}/readyz", exporter, stop)
    await wait_ready("worker", f"{worker_url}/readyz", worker, stop)
    print(f"exporter: {exporter_url}/metrics   worker: {worker_url}/v1 (OpenAI-compatible)")
    print(
        f"load: {options.concurrency} clients for {options.duration_s:g} s, "
        f"batching={options.batching} ...",
        flush=True,
    )
    plan = Plan((Load("concurrency", options.concurrency),), options.duration_s, warmup_s=0.5)
    specs = synthetic_requests(MIX, Lengths("uniform", (4, 16)), Lengths("fixed", (16,)), 0)
    results = await Runner(plan, Target(f"{worker_url}/v1", exporter_url), specs, stop).run()
    if not results:
        raise DemoFailed("stopped before the load ran")
    return results[0]


def check_result(result: StepResult) -> list[str]:
    """What went wrong in the demo's one step (empty when nothing did)."""
    problems = []
    if result.ok == 0:
        problems.append("no request succeeded")
    if result.errors:
        problems.append(f"requests failed: {result.errors}")
    if result.server is None or result.server.requests < result.ok:
        counted = 0 if result.server is None else result.server.requests
        problems.append(f"the exporter counted {counted} of {result.ok} requests")
    elif not result.server.phase_mean_ms:
        problems.append("the exporter saw no phases")
    return problems


async def _demo_then_serve(
    options: DemoOptions, children: Children, stop: asyncio.Event
) -> StepResult:
    result = await _demo(options, children, stop)
    print(table([result], record.environment()), end="", flush=True)
    if stop.is_set():
        raise DemoFailed("stopped (Ctrl-C, SIGTERM or SIGHUP)")
    if problems := check_result(result):
        raise DemoFailed("; ".join(problems))
    if options.keep_running:
        print("serving on; point Prometheus at the exporter. Ctrl-C stops both.", flush=True)
        await stop.wait()
    return result


def run_demo(options: DemoOptions) -> StepResult:
    """Run the demo; raises ``DemoFailed`` (or ``ChildFailed``) on any failure.

    One ``run_with_ctrl_c`` from the first child's start to the end, so that no moment
    is left when a stop signal would end the demo without stopping its children."""
    check_ports(options)
    with Children(quiet=False) as children:
        result, _ = run_with_ctrl_c(lambda stop: _demo_then_serve(options, children, stop))
    return result


def main(argv: Sequence[str]) -> int:
    options = parse_args(argv)
    try:
        run_demo(options)
    except (DemoFailed, ChildFailed, RuntimeError) as exc:
        print(f"gpuscope demo: {exc}", file=sys.stderr)
        return 1
    return 0
