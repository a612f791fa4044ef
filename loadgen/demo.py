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
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuscope import flags
from gpuscope.children import (
    ChildFailed,
    Children,
    free_port,
    port_taken,
    run_until_stopped,
    simulated_gpu_uuid,
)
from gpuscope.contract.http import DEFAULT_PORT, METRICS_PATH
from gpuscope.flags import Settings, at_least, between, option, positive
from gpuscope.loadgen import record
from gpuscope.loadgen.output import table
from gpuscope.loadgen.results import Load, StepResult
from gpuscope.loadgen.runner import Plan, Runner, Target
from gpuscope.loadgen.workload import Lengths, synthetic_requests
from gpuscope.worker.config import BatchingMode

MIX = {"embeddings": 1.0, "completions-stream": 1.0}
_PORT = between(0, 65535)


@dataclass(frozen=True)
class DemoOptions(
    Settings,
    prog="gpuscope demo",
    description="Start the exporter (simulated GPU) and the worker on 127.0.0.1, put a short "
    "load on them and report where the time went.",
    env_prefix="GPUSCOPE_DEMO_",
):
    duration_s: float = option(10.0, help="how long the load lasts", check=positive)
    concurrency: int = option(16, help="concurrent clients", unit="clients", check=at_least(1))
    batching: BatchingMode = option(BatchingMode.DYNAMIC, help="the worker's batching strategy")
    exporter_port: int = option(
        DEFAULT_PORT, help="exporter port on 127.0.0.1 (0: any free port)", check=_PORT
    )
    worker_port: int = option(8000, help="worker port on 127.0.0.1 (0: any free port)", check=_PORT)
    exit: bool = option(False, help="stop both processes after the report instead of serving on")

    @property
    def keep_running(self) -> bool:
        return not self.exit


class DemoFailed(RuntimeError):
    pass


def with_ports(options: DemoOptions) -> DemoOptions:
    """Port 0 means any free port: pick it here, the child processes need to be told."""
    return replace(
        options,
        exporter_port=options.exporter_port or free_port(),
        worker_port=options.worker_port or free_port(),
    )


def check_ports(options: DemoOptions) -> None:
    for name, field in (("exporter", "exporter_port"), ("worker", "worker_port")):
        port, flag = getattr(options, field), flags.spelling(DemoOptions, field)
        twin = flags.environment_twin(DemoOptions, field)
        if port_taken(port):
            # `make demo` passes no flags, but the environment reaches the demo through make
            raise DemoFailed(
                f"127.0.0.1:{port} is already in use, so the {name} cannot listen there "
                f"(is another demo, worker or exporter running?); stop it, or pass {flag} 0 "
                f"for any free port (through make: {twin}=0 make demo)"
            )


async def _demo(options: DemoOptions, children: Children, stop: asyncio.Event) -> StepResult:
    exporter = children.simulated_exporter(port=options.exporter_port)
    worker = children.worker(
        port=options.worker_port,
        batching=options.batching,
        gpu_uuid=simulated_gpu_uuid(0),
        otlp_endpoint=exporter.traces_url,
        log_level="warning",
    )
    await exporter.wait_ready(stop)
    await worker.wait_ready(stop)
    print(f"exporter: {exporter.url}{METRICS_PATH}   worker: {worker.url}/v1 (OpenAI-compatible)")
    print(
        f"load: {options.concurrency} clients for {options.duration_s:g} s, "
        f"batching={options.batching} ...",
        flush=True,
    )
    plan = Plan((Load("concurrency", options.concurrency),), options.duration_s, warmup_s=0.5)
    specs = synthetic_requests(MIX, Lengths("uniform", (4, 16)), Lengths("fixed", (16,)), 0)
    results = await Runner(plan, Target(f"{worker.url}/v1", exporter.url), specs, stop).run()
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

    One ``run_until_stopped`` from the first child's start to the end, so that no moment
    is left when a stop signal would end the demo without stopping its children."""
    check_ports(options)
    with Children(quiet=False) as children:
        result, _ = run_until_stopped(lambda stop: _demo_then_serve(options, children, stop))
    return result


def main(argv: Sequence[str]) -> int:
    options = with_ports(flags.parse(DemoOptions, argv))
    try:
        run_demo(options)
    except (DemoFailed, ChildFailed, RuntimeError) as exc:
        print(f"gpuscope demo: {exc}", file=sys.stderr)
        return 1
    return 0
