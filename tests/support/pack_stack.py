"""The whole pack on 127.0.0.1 for end-to-end tests of dashboards and alerts.

``run_pack_stack`` starts, in this order, and stops in reverse:

- a tiny OTLP sink that accepts whatever the exporter forwards (so the forwarding
  metrics exist, as with Tempo behind ``--forward-otlp``);
- the exporter, in this process, with ``gpus`` simulated GPUs running a scenario
  (``"demo"`` or ``"faults"``, from ``exporter/gpu/scenarios/``, or a path), whose
  clock the test can move (``stack.jump_scenario_to(seconds)``);
- the reference worker (``worker``: by default small synthetic models, dynamic
  batching) on uvicorn, sending every span to the exporter, told GPU 0's UUID;
- another instrumentation beside gpuscope's: a SERVER span of another scope every
  quarter second, as the stock ASGI instrumentation of a sidecar would send, so the
  exporter's span family of other instrumentation (``gpuscope_span_*``) has series;
- a bounded load (``gpuscope.loadgen``'s client loops: ``concurrency`` clients for at
  most ``load_s`` seconds, completions of ``output_tokens``, stopped when the stack
  stops);
- vLLM's ``/metrics`` as the real engine served it, replayed with growing counters
  (``support.vllm_replay``): the metrics-only path, no gpuscope in its request path;
  with ``vllm_spans``, also the spans vLLM's own tracing sent (``support.vllm_fixtures``,
  service ``vllm-traces``), posted to the exporter every second: the spans path of an
  engine that splits compute into prefill and decode;
- with ``triton``, Triton's ``/metrics`` as a real server served them, replayed
  (``support.triton_replay``), scraped as job ``triton``: an engine of the engines
  table through its own metrics only;
- a real Alertmanager (clustering off, storage in ``workdir``) with
  ``alertmanager_config`` (default: a single receiver that sends nowhere);
- a real Prometheus scraping the exporter as job ``gpuscope``, the worker's own
  ``/metrics`` as job ``gpuscope-worker`` and the vLLM replay as job ``vllm`` every
  ``scrape_interval``, exemplar storage on, loading every ``*.yml`` of ``rules_dir``
  (if given) and evaluating them at the scrape interval, alerting to that Alertmanager.

It yields a ``PackStack`` once Prometheus has seen request rates above zero, so
``rate(...)`` panels and recording rules have data straight away::

    async with run_pack_stack(tmp_path, rules_dir=REPO / "alerts" / "rules") as stack:
        async with aiohttp.ClientSession() as session:
            result = await instant_query(session, stack.prometheus_url, "up")
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from gpuscope.exporter.gpu.scenario import load_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource, simulated_uuid
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.loadgen.client import discover_model, send
from gpuscope.loadgen.workload import Lengths, synthetic_requests
from gpuscope.middleware import setup_tracing
from gpuscope.worker.app import create_app
from gpuscope.worker.config import WorkerConfig
from support.exporter_fixtures import loopback_config
from support.prometheus_server import run_alertmanager, run_prometheus, wait_for_result
from support.servers import run_uvicorn, serve_aiohttp
from support.triton_replay import run_triton_replay
from support.vllm_fixtures import export_requests
from support.vllm_replay import run_vllm_replay
from support.worker_servers import SMALL

REPO = Path(__file__).parents[2]
SCENARIOS = REPO / "exporter" / "gpu" / "scenarios"
JOB = "gpuscope"
WORKER_JOB = "gpuscope-worker"
VLLM_JOB = "vllm"  # the job pack/settings.py selects (engine_jobs, vLLM's row)
TRITON_JOB = "triton"  # the job the engine rules select (pack/engines/triton.py)
SERVICE = "pack-worker"
# The worker's sizes and batching: small synthetic models, dynamic batching, short outputs.
WORKER_CONFIG = replace(SMALL, max_new_tokens=32)
SILENT_ALERTMANAGER = (
    "route: {receiver: none, group_wait: 1s, group_interval: 1s}\nreceivers: [{name: none}]\n"
)


class ScenarioClock:
    """Wall-clock time plus an offset that ``jump_to`` moves (the simulated GPU's clock)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.origin = time.time()

    def __call__(self) -> float:
        return time.time() + self.offset

    def scenario_time(self) -> float:
        """Seconds into the scenario (the source started at ``origin``)."""
        return self() - self.origin

    def jump_to(self, seconds: float) -> None:
        """Move the scenario to ``seconds`` from its start (forward only)."""
        step = seconds - self.scenario_time()
        if step < -1.0:
            raise ValueError(f"the scenario clock only moves forward ({step:.1f} s asked)")
        self.offset += max(step, 0.0)


@dataclass
class PackStack:
    """URLs of the running stack (``http://127.0.0.1:PORT``) and the scenario's clock."""

    exporter_url: str
    worker_url: str
    vllm_url: str  # the replay of vLLM's /metrics
    prometheus_url: str
    alertmanager_url: str
    exporter_instance: str  # the ``instance`` label Prometheus gives the exporter
    worker_instance: str  # ... and the worker
    vllm_instance: str  # ... and the vLLM replay (on the exporter's host, 127.0.0.1)
    gpu_uuids: tuple[str, ...]  # simulated GPU i has gpu_uuids[i]; requests run on GPU 0
    service: str
    model: str
    clock: ScenarioClock

    def jump_scenario_to(self, seconds: float) -> None:
        """Make the simulated GPUs live ``seconds`` into their scenario from now on."""
        self.clock.jump_to(seconds)


def _scenario_path(scenario: str | Path) -> Path:
    return scenario if isinstance(scenario, Path) else SCENARIOS / f"{scenario}.yaml"


@asynccontextmanager
async def _otlp_sink() -> AsyncIterator[str]:
    """An OTLP/HTTP endpoint that accepts and discards: the exporter's forward target."""

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", accept)
    async with serve_aiohttp(app, access_log=None) as url:
        yield url + "/v1/traces"


@asynccontextmanager
async def _exporter(
    scenario: str | Path, gpus: int, start_at_s: float, forward: str
) -> AsyncIterator[tuple[RunningExporter, ScenarioClock]]:
    clock = ScenarioClock()
    source = SimulatedSource(gpus, load_scenario(_scenario_path(scenario)), clock=clock)
    clock.origin = clock()
    clock.jump_to(start_at_s)
    config = loopback_config(
        gpu_source="simulated", gpu_interval_s=0.25, forward_otlp=forward, shutdown_timeout_s=2.0
    )
    exporter = await start_exporter(config, gpu_source=source, compute_observers=[source])
    try:
        yield exporter, clock
    finally:
        await exporter.stop()


OTHER_SCOPE = "pack.other-instrumentation"


async def _other_instrumentation(provider: TracerProvider) -> None:
    """A SERVER span of another instrumentation scope every 250 ms, until cancelled."""
    tracer = provider.get_tracer(OTHER_SCOPE)
    while True:
        with tracer.start_as_current_span("GET /healthz", kind=SpanKind.SERVER) as span:
            span.set_attribute("http.response.status_code", 200)
        await asyncio.sleep(0.25)


@asynccontextmanager
async def _worker(exporter_url: str, worker: WorkerConfig) -> AsyncIterator[str]:
    """The worker in a uvicorn thread, its spans (and another instrumentation's) sent to
    the exporter every 200 ms."""
    provider = setup_tracing(
        exporter_url + "/v1/traces", SERVICE, schedule_delay_ms=200, set_global=False
    )
    config = replace(worker, gpu_uuid=simulated_uuid(0))
    other = asyncio.create_task(_other_instrumentation(provider))
    try:
        with run_uvicorn(create_app(config, tracer_provider=provider)) as url:
            yield url
    finally:
        other.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await other
        await asyncio.to_thread(provider.shutdown)


async def run_load(
    worker_url: str, load_s: float, concurrency: int, output_tokens: str = "16"
) -> None:
    """``concurrency`` closed-loop clients sending loadgen's default mix for ``load_s``,
    completions asking for ``output_tokens`` (a loadgen length: ``16``, ``uniform:8:64``)."""
    specs = synthetic_requests(
        {"embeddings": 1, "completions-stream": 1},
        Lengths.parse("prompt", "uniform:4:16"),
        Lengths.parse("output", output_tokens),
        seed=0,
    )
    base = worker_url.rstrip("/") + "/v1"
    deadline = time.monotonic() + load_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        model = await discover_model(session, base)

        async def client() -> None:
            while time.monotonic() < deadline:
                await send(session, base, model, next(specs))

        await asyncio.gather(*(client() for _ in range(concurrency)))


@asynccontextmanager
async def _load(
    worker_url: str, load_s: float, concurrency: int, output_tokens: str
) -> AsyncIterator[None]:
    task = asyncio.create_task(run_load(worker_url, load_s, concurrency, output_tokens))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@asynccontextmanager
async def _triton(enabled: bool) -> AsyncIterator[dict[str, list[str]]]:
    """The Triton replay's scrape job (job name -> its target), if enabled."""
    if not enabled:
        yield {}
        return
    async with run_triton_replay() as url:
        yield {TRITON_JOB: [_host_port(url)]}


@asynccontextmanager
async def _vllm_spans(exporter_url: str, enabled: bool) -> AsyncIterator[None]:
    """vLLM's captured export requests posted to the exporter every second, if enabled."""

    def with_new_traces(request: Any) -> bytes:
        # each round as new requests of the engine: the exporter counts a span id once
        renamed: dict[bytes, bytes] = {}
        copy = type(request).FromString(request.SerializeToString())
        for resource_spans in copy.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    span.trace_id = renamed.setdefault(span.trace_id, os.urandom(16))
        body: bytes = copy.SerializeToString()
        return body

    async def replay() -> None:
        captured = export_requests("vllm-traces")
        headers = {"Content-Type": "application/x-protobuf"}
        async with aiohttp.ClientSession() as session:
            while True:
                for body in map(with_new_traces, captured):
                    async with session.post(
                        exporter_url + "/v1/traces", data=body, headers=headers
                    ) as response:
                        response.raise_for_status()
                await asyncio.sleep(1.0)

    task = asyncio.create_task(replay()) if enabled else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _host_port(url: str) -> str:
    """``127.0.0.1:PORT`` of ``http://127.0.0.1:PORT``: a scrape target, an ``instance``."""
    return url.removeprefix("http://").rstrip("/")


def _rule_files(rules_dir: Path | None) -> list[Path]:
    return sorted(rules_dir.glob("*.yml")) if rules_dir is not None else []


@asynccontextmanager
async def run_pack_stack(
    workdir: Path,
    *,
    scenario: str | Path = "demo",
    rules_dir: Path | None = None,
    alertmanager_config: Path | None = None,
    gpus: int = 2,
    start_at_s: float = 0.0,
    load_s: float = 120.0,
    concurrency: int = 2,
    output_tokens: str = "16",
    worker: WorkerConfig = WORKER_CONFIG,
    scrape_interval: str = "1s",
    ready_timeout_s: float = 60.0,
    vllm_spans: bool = False,
    triton: bool = False,
    more_exporters: Sequence[str] = (),
) -> AsyncIterator[PackStack]:
    """Start the pack (see the module docstring); yields a ``PackStack``.

    ``start_at_s`` starts the scenario that many seconds in. ``workdir`` holds the
    Prometheus and Alertmanager configs, data and logs (``*.log``). ``more_exporters``
    are further ``host:port`` targets of job ``gpuscope`` (exporters a test runs itself).
    """
    rule_files = _rule_files(rules_dir)
    if alertmanager_config is None:
        alertmanager_config = workdir / "alertmanager-silent.yml"
        alertmanager_config.write_text(SILENT_ALERTMANAGER)
    async with (
        _otlp_sink() as sink,
        _exporter(scenario, gpus, start_at_s, sink) as (exporter, clock),
        _worker(exporter.url, worker) as worker_url,
        _load(worker_url, load_s, concurrency, output_tokens),
        _vllm_spans(exporter.url, vllm_spans),
        run_vllm_replay() as vllm_url,
        _triton(triton) as triton_job,
        run_alertmanager(alertmanager_config, workdir) as alertmanager_url,
        run_prometheus(
            [f"127.0.0.1:{exporter.port}", *more_exporters],
            workdir,
            scrape_interval,
            rule_files=rule_files,
            alertmanager=alertmanager_url,
            job=JOB,
            more_jobs={
                WORKER_JOB: [_host_port(worker_url)],
                VLLM_JOB: [_host_port(vllm_url)],
                **triton_job,
            },
        ) as prometheus_url,
    ):
        async with aiohttp.ClientSession() as session:
            for ready in (
                "sum(rate(gpuscope_request_duration_seconds_count[1m])) > 0",
                f'up{{job="{WORKER_JOB}"}} == 1',
                f'up{{job="{VLLM_JOB}"}} == 1',
            ):
                await wait_for_result(session, prometheus_url, ready, ready_timeout_s)
        yield PackStack(
            exporter_url=exporter.url,
            worker_url=worker_url,
            vllm_url=vllm_url,
            prometheus_url=prometheus_url,
            alertmanager_url=alertmanager_url,
            exporter_instance=f"127.0.0.1:{exporter.port}",
            worker_instance=_host_port(worker_url),
            vllm_instance=_host_port(vllm_url),
            gpu_uuids=tuple(simulated_uuid(i) for i in range(gpus)),
            service=SERVICE,
            model=worker.model_name,
            clock=clock,
        )
