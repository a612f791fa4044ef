"""The metric families the exporter serves: the definition tables, a live scrape and the
docs all agree with one golden list, so a renamed family or label cannot slip through."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gpuscope import spans as contract
from gpuscope.contract.exporter import EXPORTER_METRICS
from gpuscope.contract.gpu import GPU_METRICS
from gpuscope.contract.labels import OMIT_EMPTY
from gpuscope.contract.rows import MetricDef, MetricType
from gpuscope.exporter.gpu.scenario import parse_scenario
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.service import start_exporter
from support.exporter_fixtures import T0, SpanFactory, encode, loopback_config, post_spans, scrape

DOCS = Path(__file__).resolve().parents[2] / "docs"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
_GPU = ("gpu", "uuid")
_STOCK = (
    "service_name",
    "span_name",
    "span_kind",
    "status_code",
    "http_status_code",
    "rpc_grpc_status_code",
)

# (name, type, unit, labels): what dashboards, alerts and users' queries rely on.
GOLDEN: list[tuple[str, str, str, tuple[str, ...]]] = [
    (
        "gpuscope_request_duration_seconds",
        "histogram",
        "seconds",
        ("service", "model", "operation", "route", "code", "uuid", "gpu", "namespace", "pod"),
    ),
    (
        "gpuscope_request_phase_seconds",
        "histogram",
        "seconds",
        ("phase", "service", "model", "uuid", "gpu", "namespace", "pod"),
    ),
    (
        "gpuscope_request_compute_stage_seconds",
        "histogram",
        "seconds",
        ("stage", "service", "model", "uuid", "gpu", "namespace", "pod"),
    ),
    (
        "gpuscope_time_to_first_token_seconds",
        "histogram",
        "seconds",
        ("service", "model", "operation", "uuid", "gpu", "namespace", "pod"),
    ),
    (
        "gpuscope_time_per_output_token_seconds",
        "histogram",
        "seconds",
        ("service", "model", "operation", "uuid", "gpu", "namespace", "pod"),
    ),
    (
        "gpuscope_batch_size",
        "histogram",
        "",
        ("service", "model", "uuid", "gpu", "namespace", "pod"),
    ),
    ("gpuscope_tokens", "counter", "", ("direction", "service", "model", "operation")),
    ("gpuscope_span_calls", "counter", "", _STOCK),
    ("gpuscope_span_duration_seconds", "histogram", "seconds", _STOCK),
    ("gpuscope_series_overflow", "counter", "", ("metric", "reason")),
    ("gpuscope_build_info", "gauge", "", ("version",)),
    ("gpuscope_gpu_source_info", "gauge", "", ("requested", "source")),
    ("gpuscope_spans_received", "counter", "", ()),
    ("gpuscope_spans_rejected", "counter", "", ("reason",)),
    ("gpuscope_otlp_requests_rejected", "counter", "", ("reason",)),
    ("gpuscope_forward_spans_sent", "counter", "", ()),
    ("gpuscope_forward_spans_dropped", "counter", "", ("reason",)),
    ("gpuscope_web_config_reloads", "counter", "", ("result",)),
    ("gpuscope_http_connections", "gauge", "", ("state",)),
    ("gpuscope_http_connections_max", "gauge", "", ()),
    ("gpuscope_http_connections_closed", "counter", "", ("reason",)),
    (
        "gpuscope_gpu_info",
        "gauge",
        "",
        ("gpu", "uuid", "name", "pci_bus_id", "numa_node", "driver_version"),
    ),
    (
        "gpuscope_gpu_mig_info",
        "gauge",
        "",
        (*_GPU, "parent_gpu", "parent_uuid", "profile", "gpu_instance_id", "compute_instance_id"),
    ),
    ("gpuscope_gpu_up", "gauge", "", _GPU),
    ("gpuscope_gpu_down_reason", "gauge", "", (*_GPU, "reason")),
    ("gpuscope_gpu_sample_age_seconds", "gauge", "seconds", ()),
    ("gpuscope_gpu_sm_clock_hertz", "gauge", "hertz", _GPU),
    ("gpuscope_gpu_sm_clock_target_hertz", "gauge", "hertz", _GPU),
    ("gpuscope_gpu_sm_clock_max_hertz", "gauge", "hertz", _GPU),
    ("gpuscope_gpu_memory_clock_hertz", "gauge", "hertz", _GPU),
    ("gpuscope_gpu_memory_clock_max_hertz", "gauge", "hertz", _GPU),
    ("gpuscope_gpu_utilization_ratio", "gauge", "ratio", _GPU),
    ("gpuscope_gpu_sm_occupancy_ratio", "gauge", "ratio", _GPU),
    ("gpuscope_gpu_sm_active_ratio", "gauge", "ratio", _GPU),
    ("gpuscope_gpu_tensor_active_ratio", "gauge", "ratio", _GPU),
    ("gpuscope_gpu_dram_active_ratio", "gauge", "ratio", _GPU),
    ("gpuscope_gpu_pcie_link_generation", "gauge", "", _GPU),
    ("gpuscope_gpu_pcie_link_width", "gauge", "", _GPU),
    ("gpuscope_gpu_memory_used_bytes", "gauge", "bytes", _GPU),
    ("gpuscope_gpu_memory_reserved_bytes", "gauge", "bytes", _GPU),
    ("gpuscope_gpu_memory_total_bytes", "gauge", "bytes", _GPU),
    ("gpuscope_gpu_power_watts", "gauge", "watts", _GPU),
    ("gpuscope_gpu_power_limit_watts", "gauge", "watts", _GPU),
    ("gpuscope_gpu_temperature_celsius", "gauge", "celsius", _GPU),
    ("gpuscope_gpu_pcie_transmit_bytes", "counter", "bytes", _GPU),
    ("gpuscope_gpu_pcie_receive_bytes", "counter", "bytes", _GPU),
    ("gpuscope_gpu_nvlink_links", "gauge", "", _GPU),
    ("gpuscope_gpu_nvlink_transmit_bytes", "counter", "bytes", _GPU),
    ("gpuscope_gpu_nvlink_receive_bytes", "counter", "bytes", _GPU),
    ("gpuscope_gpu_energy_joules", "counter", "joules", _GPU),
    ("gpuscope_gpu_clock_event_active", "gauge", "", (*_GPU, "reason")),
    ("gpuscope_gpu_xid_events", "counter", "", _GPU),
    ("gpuscope_gpu_xid_errors", "counter", "", (*_GPU, "xid")),
    ("gpuscope_gpu_ecc_errors", "counter", "", (*_GPU, "type")),
    ("gpuscope_gpu_process_join_status", "gauge", "", ("status",)),
    ("gpuscope_gpu_process_join_processes", "gauge", "", ()),
    ("gpuscope_gpu_sm_clock_changes", "counter", "", _GPU),
    ("gpuscope_gpu_compute_mode", "gauge", "", (*_GPU, "mode")),
    ("gpuscope_gpu_compute_processes", "gauge", "", _GPU),
    ("gpuscope_gpu_mps_processes", "gauge", "", _GPU),
    ("gpuscope_gpu_contended", "gauge", "", _GPU),
    ("gpuscope_gpu_process_memory_used_bytes", "gauge", "bytes", (*_GPU, "pid")),
    ("gpuscope_gpu_process_sm_utilization_ratio", "gauge", "ratio", (*_GPU, "pid")),
    ("gpuscope_gpu_process_numa_locality", "gauge", "", (*_GPU, "pid", "locality")),
    ("gpuscope_collector_success", "gauge", "", ("collector",)),
    ("gpuscope_collector_duration_seconds", "gauge", "seconds", ("collector",)),
]


def _row(definition: MetricDef) -> tuple[str, str, str, tuple[str, ...]]:
    return definition.name, str(definition.type), definition.unit, definition.labels


def test_definition_tables_match_the_golden_list() -> None:
    tables = [_row(d) for d in (*EXPORTER_METRICS, *GPU_METRICS)]
    assert len(set(tables)) == len(tables)  # no family defined twice
    assert sorted(tables) == sorted(GOLDEN)


def test_docs_name_every_family() -> None:
    text = (DOCS / "exporter.md").read_text() + (DOCS / "gpu.md").read_text()
    documented = set(re.findall(r"`(gpuscope_[a-z_]+)", text))
    missing = [d.sample_name for d in (*EXPORTER_METRICS, *GPU_METRICS)]
    assert [name for name in missing if name not in documented] == []


def _foreign_server_span() -> ReadableSpan:
    """A SERVER span of another instrumentation scope (feeds the stock-span families)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "other"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("opentelemetry.instrumentation.asgi")
    span = tracer.start_span(
        "GET /x", kind=SpanKind.SERVER, attributes={"http.route": "/x"}, start_time=T0
    )
    span.end(end_time=T0 + 10_000_000)
    return memory.get_finished_spans()[-1]


def _spans() -> list[ReadableSpan]:
    factory = SpanFactory()
    server = factory.server(
        0.05,
        phases=dict.fromkeys(contract.PHASES, 0.001),
        attrs={
            contract.TIME_TO_FIRST_TOKEN: 0.02,
            contract.TIME_PER_OUTPUT_TOKEN: 0.003,
            contract.GEN_AI_USAGE_INPUT_TOKENS: 5,
            contract.GEN_AI_OPERATION_NAME: "chat",
            **dict.fromkeys(contract.COMPUTE_STAGE_DURATION.values(), 0.0005),
        },
    )
    return [server, factory.batch(4), _foreign_server_span()]


NVML_ONLY = {
    "gpuscope_gpu_mig_info",
    "gpuscope_gpu_process_memory_used_bytes",
    "gpuscope_gpu_process_sm_utilization_ratio",
    "gpuscope_gpu_process_numa_locality",
}


async def test_a_scrape_serves_the_golden_families_with_their_labels(
    exporter_http: aiohttp.ClientSession,
) -> None:
    events = [
        {"at": 0, "gpu": 0, "fault": "xid", "xid": 79},
        {"at": 0, "duration": 600, "gpu": 1, "fault": "fall_off_bus"},  # for gpu_down_reason
    ]
    scenario = parse_scenario({"events": events})
    config = loopback_config(gpu_interval_s=0.05, forward_otlp="http://127.0.0.1:9/v1/traces")
    exporter = await start_exporter(config, gpu_source=SimulatedSource(2, scenario))
    try:
        body = encode(_spans()).SerializeToString()
        assert (await post_spans(exporter_http, exporter, body))[0] == 200
        text = ""
        for _ in range(200):  # until the first GPU poll is in (bounded: 10 s)
            text = await scrape(exporter_http, exporter, accept=OPENMETRICS)
            if "gpuscope_gpu_up{" in text:
                break
            await asyncio.sleep(0.05)
    finally:
        await exporter.stop()
    served = {}
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        labels = {name for s in family.samples for name in s.labels} - {"le"}
        served[family.name] = (family.type, family.unit, labels)
    golden = {name: (kind, unit, set(labels)) for name, kind, unit, labels in GOLDEN}
    assert set(served) == set(golden)
    # in the tables' order: the exporter's collected families, the GPU's, the histograms
    collected = [d.name for d in EXPORTER_METRICS if d.type is not MetricType.HISTOGRAM]
    histograms = [d.name for d in EXPORTER_METRICS if d.type is MetricType.HISTOGRAM]
    assert list(served) == [*collected, *(d.name for d in GPU_METRICS), *histograms]
    for name, (kind, unit, labels) in golden.items():
        # every family here but those simulated GPUs do not give (MIG; per process, with no
        # process listed here; their labels are checked on the C fake NVML: tests/exporter/gpu/
        # test_gpu_cnvml_mig.py, _sharing.py, _numa.py) has samples, so its labels show
        if name in NVML_ONLY:
            assert served[name] == (kind, unit, set()), name
            continue
        # the pod's labels only on the series of a sender that names its pod (none here)
        assert served[name] == (kind, unit, labels - OMIT_EMPTY), name
