"""gpuscope on a real Ray Serve (``ray[serve]`` 2.60.0): run by ``make ray-check``.

One deployment (``scripts/engines/ray_serve_app.py``) with two replicas, each exporting
its spans to one gpuscope exporter, which forwards them to a sink in this process. The
deployment is the documented setup: FastAPI ingress under ``GpuscopeMiddleware``,
``setup_tracing()`` in the replica, ``gpuscope.middleware.ray_serve.batch`` in place of
``@serve.batch`` (max_batch_size 4, batch_wait_timeout_s 0.05).

Checked: every request served is counted once in the request histogram and once per
phase; batch sizes add up to the requests; a batch is ``full`` exactly when it held 4;
a lone request waits Ray's window in ``batch_wait``, not in ``queue``; both replicas'
``service.instance.id`` come through, each batch linking only to its own replica's
requests; the exporter's exemplars open those traces; and a plain ``@serve.batch``
handler does not see its request's timeline (why the wrapper exists).
Skipped unless ``GPUSCOPE_RAY_PYTHON`` names the Ray venv's interpreter.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope import spans as contract
from gpuscope.children import Child, Children
from support.exporter_fixtures import samples
from support.otlp_sink import OtlpSink, ReceivedSpan
from support.ray_serve_engine import RayServeApp, ray_python, ray_serve_app
from support.servers import run_uvicorn
from support.vllm_engine import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(ray_python() is None, reason="GPUSCOPE_RAY_PYTHON unset (make ray-check)"),
]

SERVICE = "ray-embedder"  # the app's constants
MODEL = "toy-embedder"
MAX_BATCH_SIZE = 4
WINDOW_S = 0.05
BURST_REQUESTS, BURST_CONCURRENCY = 96, 16
LONE_REQUESTS = 6
PROBES = 8
SERVER = 2  # OTLP SpanKind


@dataclass
class Stack:
    exporter: str
    sink: OtlpSink
    app: RayServeApp
    served: Counter[str]  # /embed answers per replica (service.instance.id)
    lone_traces: list[str]
    probes: list[dict[str, Any]]


def start_exporter(children: Children, work: Path, port: int, forward: str) -> Child:
    exporter = children.exporter(
        port=port,
        log=work / "exporter.log",
        prefix=("nice",),
        gpu_source="none",
        forward_otlp=forward,
    )
    exporter.wait_ready_blocking()
    return exporter


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200
        return json.loads(answer.read())


def drive(app: RayServeApp) -> tuple[Counter[str], list[str], list[dict[str, Any]]]:
    """A burst that fills batches, lone requests that each wait the window, the probes."""
    served: Counter[str] = Counter()

    def embed(index: int) -> str:
        answer = post(app.url + "/embed", {"text": f"burst {index}"})
        return str(answer["instance"])

    with ThreadPoolExecutor(BURST_CONCURRENCY) as pool:
        served.update(pool.map(embed, range(BURST_REQUESTS)))
    lone_traces = []
    for index in range(LONE_REQUESTS):
        trace_id = os.urandom(16).hex()
        answer = post(
            app.url + "/embed",
            {"text": f"lone {index}"},
            {"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"},
        )
        served[answer["instance"]] += 1
        lone_traces.append(trace_id)
    probes = [post(app.url + "/probe", {}) for _ in range(PROBES)]
    return served, lone_traces, probes


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    python = ray_python()
    assert python is not None
    work = tmp_path_factory.mktemp("r")  # short: Ray's socket paths live under it
    sink = OtlpSink()
    with run_uvicorn(sink) as sink_url, Children() as children:
        exporter = start_exporter(children, work, free_port(), sink_url + "/v1/traces")
        started = time.monotonic()
        with ray_serve_app(
            python, work / "app", (free_port(), free_port()), exporter.traces_url
        ) as app:
            print(f"Ray Serve ready in {time.monotonic() - started:.1f} s")
            served, lone_traces, probes = drive(app)
            yield Stack(exporter.url, sink, app, served, lone_traces, probes)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(values: Samples, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, label_items), value in values.items()
        if sample == name and labels.items() <= dict(label_items).items()
    )


def counted(stack: Stack) -> Samples:
    """The exporter's metrics once every served /embed request is in (spans trickle in)."""
    want = sum(stack.served.values())
    deadline = time.monotonic() + 60
    while True:
        values = scrape(stack.exporter)
        got = total(
            values, "gpuscope_request_duration_seconds_count", service=SERVICE, route="/embed"
        )
        if got >= want or time.monotonic() > deadline:
            return values
        time.sleep(0.5)


def embed_spans(stack: Stack) -> tuple[list[ReceivedSpan], list[ReceivedSpan]]:
    """The /embed server spans and the batch spans the sink got, once all are in."""
    want = sum(stack.served.values())
    deadline = time.monotonic() + 60
    while True:
        spans = stack.sink.of_service(SERVICE)
        servers = [
            s
            for s in spans
            if s.kind == SERVER and s.attributes.get(contract.HTTP_ROUTE) == "/embed"
        ]
        batches = [s for s in spans if s.name == contract.BATCH_SPAN_NAME]
        sizes = sum(b.attributes[contract.BATCH_SIZE] for b in batches)
        if (len(servers) >= want and sizes >= want) or time.monotonic() > deadline:
            return servers, batches
        time.sleep(0.5)


def test_both_replicas_served(stack: Stack) -> None:
    assert len(stack.served) == 2, stack.served
    assert sum(stack.served.values()) == BURST_REQUESTS + LONE_REQUESTS


def test_each_request_counted_once_and_once_per_phase(stack: Stack) -> None:
    values = counted(stack)
    served = sum(stack.served.values())
    embed = {"service": SERVICE, "route": "/embed"}
    assert total(values, "gpuscope_request_duration_seconds_count", **embed) == served
    assert total(values, "gpuscope_request_duration_seconds_count", **embed, code="200") == served
    for phase in contract.PHASES:  # queue, batch_wait and compute, and the two around them
        assert (
            total(
                values,
                "gpuscope_request_phase_seconds_count",
                service=SERVICE,
                model=MODEL,
                phase=phase,
            )
            == served
        ), phase
    # Batches: their sizes add up to the requests, one count per batch span.
    _, batches = embed_spans(stack)
    assert total(values, "gpuscope_batch_size_sum", service=SERVICE, model=MODEL) == served
    assert total(values, "gpuscope_batch_size_count", service=SERVICE) == len(batches)


def test_triggers_follow_the_batch_size(stack: Stack) -> None:
    _, batches = embed_spans(stack)
    triggers: Counter[str] = Counter()
    for batch in batches:
        size = batch.attributes[contract.BATCH_SIZE]
        trigger = batch.attributes[contract.BATCH_TRIGGER]
        assert batch.attributes[contract.BATCH_MAX_SIZE] == MAX_BATCH_SIZE
        assert 1 <= size <= MAX_BATCH_SIZE
        assert trigger == ("full" if size == MAX_BATCH_SIZE else "timeout"), batch
        triggers[trigger] += 1
    assert triggers["full"] >= 1, "16 clients on two replicas never filled a batch of 4"
    assert triggers["timeout"] >= LONE_REQUESTS


def test_a_lone_request_waits_the_window_in_batch_wait(stack: Stack) -> None:
    servers, batches = embed_spans(stack)
    by_trace = {server.trace_id: server for server in servers}
    batch_by_id = {batch.attributes[contract.BATCH_ID]: batch for batch in batches}
    for trace_id in stack.lone_traces:
        server = by_trace[trace_id]  # the caller's traceparent was continued
        values = server.attributes
        # Ray's batcher took it at once (idle), then held it for the whole window.
        assert values[contract.PHASE_DURATION["batch_wait"]] >= WINDOW_S * 0.98
        assert values[contract.PHASE_DURATION["queue"]] < WINDOW_S / 5
        batch = batch_by_id[values[contract.BATCH_ID]]
        assert batch.attributes[contract.BATCH_SIZE] == 1
        assert batch.attributes[contract.BATCH_TRIGGER] == "timeout"
        assert batch.links == ((server.trace_id, server.span_id),)


def test_spans_of_both_replicas_and_batches_link_their_own_requests(stack: Stack) -> None:
    servers, batches = embed_spans(stack)
    instance_of = {(s.trace_id, s.span_id): s.resource["service.instance.id"] for s in servers}
    assert set(instance_of.values()) == set(stack.served)  # the ids the replicas answered
    assert Counter(instance_of.values()) == stack.served
    assert len({s.resource["process.pid"] for s in servers}) == 2
    linked: Counter[tuple[str, str]] = Counter()
    for batch in batches:
        assert batch.links, "every /embed call came with a request"
        assert {instance_of[link] for link in batch.links} == {
            batch.resource["service.instance.id"]
        }
        linked.update(batch.links)
    # every request rode in exactly one batch, and says which
    assert set(linked) == set(instance_of) and set(linked.values()) == {1}
    batch_ids = {batch.attributes[contract.BATCH_ID] for batch in batches}
    assert len(batch_ids) == len(batches)
    for server in servers:
        assert server.attributes[contract.BATCH_ID] in batch_ids
        children = {
            s.name
            for s in stack.sink.of_service(SERVICE)
            if s.parent_span_id == server.span_id and s.trace_id == server.trace_id
        }
        assert children == set(contract.PHASE_SPANS.values())


def test_exemplars_open_the_traces(stack: Stack) -> None:
    servers, _ = embed_spans(stack)
    traces = {server.trace_id for server in servers}
    request = urllib.request.Request(
        stack.exporter + "/metrics", headers={"Accept": "application/openmetrics-text"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read().decode()
    exemplars = {
        sample.labels["phase"]: sample.exemplar.labels["trace_id"]
        for sample in samples(text, openmetrics=True)
        if sample.name == "gpuscope_request_phase_seconds_bucket"
        and sample.exemplar is not None
        and sample.labels.get("service") == SERVICE
    }
    for phase in ("queue", "batch_wait", "compute"):
        assert exemplars.get(phase) in traces, phase


def test_a_plain_serve_batch_handler_sees_the_wrong_timeline(stack: Stack) -> None:
    """Ray runs every batch in its batcher's context, copied from the first request that
    reached the method: inside the handler ``current_timeline()`` is that request's."""
    own = Counter(probe["instance"] for probe in stack.probes if probe["handler_saw_own_timeline"])
    assert all(count <= 1 for count in own.values()), own
    assert sum(own.values()) <= 2 < PROBES


RAY_BATCH_COUNTS = (
    "ray_serve_batches_processed_total",
    "ray_serve_actual_batch_size_count",
    "ray_serve_batch_wait_time_ms_count",
    "ray_serve_batch_execution_time_ms_count",
)


def ray_metrics(stack: Stack, batches: int) -> Samples:
    """Ray's own metrics once its workers reported every batch in every one of them
    (each family is pushed on its own: one can be a batch behind another)."""
    deadline = time.monotonic() + 60
    while True:
        values = scrape(stack.app.metrics_url)
        done = min(total(values, name, function_name="embed_batch") for name in RAY_BATCH_COUNTS)
        if done >= batches or time.monotonic() > deadline:
            return values
        time.sleep(0.5)


def test_rays_own_metrics_count_the_same_batches(stack: Stack) -> None:
    _, batches = embed_spans(stack)
    ray = ray_metrics(stack, len(batches))
    handler = {"function_name": "embed_batch"}
    for name in RAY_BATCH_COUNTS:
        assert total(ray, name, **handler) == len(batches), name
    # the same split between the replicas (Ray names them otherwise)
    ray_split = sorted(
        value
        for (name, labels), value in ray.items()
        if name == "ray_serve_batches_processed_total"
        and dict(labels).get("function_name") == "embed_batch"
    )
    ours = Counter(batch.resource["service.instance.id"] for batch in batches)
    assert ray_split == sorted(ours.values())


def test_report(stack: Stack) -> None:
    """The figures of docs/engines/ray-serve.md: gpuscope's per-request means beside
    Ray's per-batch histograms over the same requests (printed; shown by -rP)."""
    values = counted(stack)
    servers, batches = embed_spans(stack)
    ray = ray_metrics(stack, len(batches))
    handler = {"function_name": "embed_batch"}
    served = len(servers)
    lone = set(stack.lone_traces)
    triggers = Counter(str(batch.attributes[contract.BATCH_TRIGGER]) for batch in batches)
    lines = [
        f"{served} requests ({len(lone)} alone), 2 replicas, {len(batches)} batches: "
        f"{triggers['full']} full, {triggers['timeout']} timeout"
    ]
    for phase in contract.PHASES:
        labels = {"service": SERVICE, "phase": phase}
        mean = total(values, "gpuscope_request_phase_seconds_sum", **labels) / served
        lone_mean = sum(
            s.attributes[contract.PHASE_DURATION[phase]] for s in servers if s.trace_id in lone
        ) / len(lone)
        lines.append(
            f"gpuscope {phase:<11} mean {mean * 1e3:7.2f} ms  alone {lone_mean * 1e3:7.2f} ms"
        )
    sizes = sum(batch.attributes[contract.BATCH_SIZE] for batch in batches)
    executed = sum(batch.end_ns - batch.start_ns for batch in batches) / len(batches) / 1e6
    ray_sizes = total(ray, "ray_serve_actual_batch_size_sum", **handler)
    ray_wait = total(ray, "ray_serve_batch_wait_time_ms_sum", **handler) / len(batches)
    ray_execution = total(ray, "ray_serve_batch_execution_time_ms_sum", **handler) / len(batches)
    lines += [
        f"batch sizes: gpuscope sum {sizes}, Ray's _sum {ray_sizes:g}",
        f"batch execution mean: gpuscope {executed:.2f} ms, Ray's {ray_execution:.2f} ms",
        f"Ray's batch wait mean (per batch, from its _sum) {ray_wait:.2f} ms",
    ]
    print("\n".join(lines))
    assert sizes == served
