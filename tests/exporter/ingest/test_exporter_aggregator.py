"""Span -> histogram aggregation, tested directly on decoded requests (no I/O)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue
from prometheus_client import CollectorRegistry

from gpuscope import spans as contract
from gpuscope.exporter.http.render import render_histograms
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.ingest.series import OVERFLOW
from gpuscope.exporter.self_metrics import ExporterCollector, SelfMetrics
from support.exporter_fixtures import T0, FakeGpuSource, SpanFactory, encode, samples, value


class Scraped:
    """The samples the aggregator's collector yields; lookups match a subset of labels."""

    def __init__(self, aggregator: SpanAggregator) -> None:
        registry = CollectorRegistry()
        registry.register(ExporterCollector(aggregator, SelfMetrics()))
        self.samples = [s for metric in registry.collect() for s in metric.samples]
        self.samples += samples(render_histograms(aggregator.histograms, openmetrics=False))

    def get_sample_value(self, name: str, labels: dict[str, str]) -> float | None:
        return value(self.samples, name, labels)


def registry_of(aggregator: SpanAggregator) -> Scraped:
    return Scraped(aggregator)


def test_server_span_feeds_duration_phases_streaming_and_tokens() -> None:
    spans = SpanFactory(service="svc")
    phases = {"preprocess": 0.001, "queue": 0.0004, "batch_wait": 0.002, "compute": 0.03}
    span = spans.server(
        0.05,
        phases=phases,
        attrs={
            contract.TIME_TO_FIRST_TOKEN: 0.02,
            contract.TIME_PER_OUTPUT_TOKEN: 0.004,
            contract.GEN_AI_USAGE_INPUT_TOKENS: 12,
            contract.GEN_AI_USAGE_OUTPUT_TOKENS: 7,
        },
    )
    aggregator = SpanAggregator()
    result = aggregator.ingest(encode([span]))
    assert (result.received, result.aggregated, result.rejected_total) == (1, 1, 0)
    reg = registry_of(aggregator)
    base = {"service": "svc", "model": "m1", "uuid": "GPU-aaaa", "gpu": ""}
    duration = {**base, "route": "/v1/completions", "code": "200"}
    assert reg.get_sample_value("gpuscope_request_duration_seconds_count", duration) == 1
    assert reg.get_sample_value("gpuscope_request_duration_seconds_sum", duration) == pytest.approx(
        0.05
    )
    assert (
        reg.get_sample_value("gpuscope_request_duration_seconds_bucket", {**duration, "le": "0.05"})
        == 1
    )
    assert (
        reg.get_sample_value(
            "gpuscope_request_duration_seconds_bucket", {**duration, "le": "0.025"}
        )
        == 0
    )
    for phase, seconds in phases.items():
        labels = {**base, "phase": phase}
        assert reg.get_sample_value("gpuscope_request_phase_seconds_sum", labels) == pytest.approx(
            seconds
        )
    # A phase that never happened is absent, not zero.
    absent = {**base, "phase": "postprocess"}
    assert reg.get_sample_value("gpuscope_request_phase_seconds_count", absent) is None
    # 400 µs lands in the 500 µs bucket, not in the 250 µs one: buckets reach down there.
    queue = {**base, "phase": "queue"}
    assert reg.get_sample_value("gpuscope_request_phase_seconds_bucket", {**queue, "le": "0.0005"})
    assert (
        reg.get_sample_value("gpuscope_request_phase_seconds_bucket", {**queue, "le": "0.00025"})
        == 0
    )
    assert reg.get_sample_value("gpuscope_time_to_first_token_seconds_sum", base) == 0.02
    assert reg.get_sample_value("gpuscope_time_per_output_token_seconds_sum", base) == 0.004
    tokens = {"service": "svc", "model": "m1"}
    assert reg.get_sample_value("gpuscope_tokens_total", {**tokens, "direction": "input"}) == 12
    assert reg.get_sample_value("gpuscope_tokens_total", {**tokens, "direction": "output"}) == 7


def test_child_spans_are_received_but_not_counted_twice() -> None:
    spans = SpanFactory()
    batch = [spans.server(0.01, phases={"queue": 0.002})]
    batch += [spans.internal(name) for name in contract.PHASE_SPANS.values()]
    aggregator = SpanAggregator()
    result = aggregator.ingest(encode(batch))
    assert (result.received, result.aggregated, result.rejected_total) == (4, 1, 0)
    reg = registry_of(aggregator)
    assert reg.get_sample_value("gpuscope_request_phase_seconds_count", {"phase": "queue"}) == 1


def test_batch_span_feeds_batch_size_and_the_compute_observers() -> None:
    spans = SpanFactory(service="svc")
    source = FakeGpuSource()
    aggregator = SpanAggregator(compute_observers=[source])
    aggregator.set_gpu_devices(source.devices())
    members = [spans.server(0.01) for _ in range(3)]
    batch = spans.batch(3, duration_s=0.02, links=members)
    aggregator.ingest(encode([*members, batch]))
    reg = registry_of(aggregator)
    labels = {"service": "svc", "model": "m1", "uuid": "GPU-aaaa", "gpu": "0"}
    assert reg.get_sample_value("gpuscope_batch_size_sum", labels) == 3
    assert reg.get_sample_value("gpuscope_batch_size_bucket", {**labels, "le": "4.0"}) == 1
    # The gpu label comes from the source's device list, joined on the UUID.
    assert reg.get_sample_value("gpuscope_request_duration_seconds_count", labels) == 3
    assert [(u, size, most) for u, _, size, most in source.compute] == [("GPU-aaaa", 3, 32)]
    assert source.compute[0][1] == pytest.approx(0.02)


def test_span_service_attribute_overrides_the_resource() -> None:
    spans = SpanFactory(service="from-resource")
    span = spans.server(0.01, attrs={contract.SERVICE_NAME: "from-span"})
    aggregator = SpanAggregator()
    aggregator.ingest(encode([span]))
    reg = registry_of(aggregator)
    count = "gpuscope_request_duration_seconds_count"
    assert reg.get_sample_value(count, {"service": "from-span", "route": "/v1/completions"}) == 1


@pytest.mark.parametrize(
    ("attributes", "reason"),
    [
        ({contract.PHASE_DURATION["queue"]: "fast"}, "wrong_attribute_type"),
        ({contract.PHASE_DURATION["queue"]: math.nan}, "invalid_duration"),
        ({contract.PHASE_DURATION["compute"]: -0.5}, "invalid_duration"),
        ({contract.TIME_TO_FIRST_TOKEN: math.inf}, "invalid_duration"),
        ({contract.TIME_TO_FIRST_TOKEN: 1.7e308}, "invalid_duration"),
        ({contract.PHASE_DURATION["compute"]: 86_400.5}, "invalid_duration"),
        ({contract.TIME_PER_OUTPUT_TOKEN: 2**62}, "invalid_duration"),
        ({contract.HTTP_RESPONSE_STATUS_CODE: "200"}, "wrong_attribute_type"),
        ({contract.HTTP_RESPONSE_STATUS_CODE: 1200}, "invalid_attribute_value"),
        ({contract.GEN_AI_USAGE_OUTPUT_TOKENS: -3}, "invalid_attribute_value"),
        ({contract.GEN_AI_REQUEST_MODEL: "m" * 500}, "invalid_label"),
        ({contract.GEN_AI_REQUEST_MODEL: "bad\nmodel"}, "invalid_label"),
        ({contract.GPU_UUID: 7}, "wrong_attribute_type"),
    ],
)
def test_bad_span_is_rejected_alone_with_its_reason(
    attributes: dict[str, AttributeValue], reason: str
) -> None:
    spans = SpanFactory()
    good = spans.server(0.01, phases={"queue": 0.001})
    bad = spans.server(0.01, phases={"queue": 0.001}, attrs=attributes)
    other_good = spans.server(0.01, phases={"queue": 0.001})
    aggregator = SpanAggregator()
    result = aggregator.ingest(encode([good, bad, other_good]))
    assert result.rejected == {reason: 1}
    assert result.aggregated == 2
    assert result.first_error is not None
    assert reason in result.error_message()
    reg = registry_of(aggregator)
    # Nothing of the bad span was counted, not even the parts before the bad attribute.
    assert reg.get_sample_value("gpuscope_request_duration_seconds_count", {"code": "200"}) == 2
    assert reg.get_sample_value("gpuscope_request_phase_seconds_count", {"phase": "queue"}) == 2


def test_negative_span_duration_and_bad_ids_are_rejected() -> None:
    spans = SpanFactory()
    request = encode([spans.server(0.01), spans.server(0.01), spans.server(0.01)])
    first, second, _ = request.resource_spans[0].scope_spans[0].spans
    first.end_time_unix_nano = first.start_time_unix_nano - 1
    second.trace_id = b"\x00" * 16
    result = SpanAggregator().ingest(request)
    assert result.rejected == {"invalid_duration": 1, "invalid_id": 1}
    assert result.aggregated == 1


def test_batch_span_without_size_is_rejected() -> None:
    spans = SpanFactory()
    request = encode([spans.batch(4)])
    span = request.resource_spans[0].scope_spans[0].spans[0]
    keep = [kv for kv in span.attributes if kv.key != contract.BATCH_SIZE]
    del span.attributes[:]
    span.attributes.extend(keep)
    result = SpanAggregator().ingest(request)
    assert result.rejected == {"missing_attribute": 1}


def test_label_sets_past_the_cap_go_to_one_overflow_series() -> None:
    spans = SpanFactory(service="svc")
    batch = [spans.server(0.01, route=f"/r{i}") for i in range(10)]
    aggregator = SpanAggregator(max_series=4)
    aggregator.ingest(encode(batch))
    assert len(aggregator.duration) == 5  # 4 real + the overflow series
    assert aggregator.duration.overflowed == 6
    reg = registry_of(aggregator)
    # the exporter's own gpu label ("" here: no GPU source) is kept, the rest fold; the
    # pod's, empty, are left out as on every other series of a sender without a pod
    names = set(aggregator.duration.label_names) - {"namespace", "pod"}
    overflow = dict.fromkeys(names, OVERFLOW) | {"gpu": ""}
    assert reg.get_sample_value("gpuscope_request_duration_seconds_count", overflow) == 6
    assert (
        reg.get_sample_value(
            "gpuscope_series_overflow_total",
            {"metric": "gpuscope_request_duration_seconds", "reason": "max_series"},
        )
        == 6
    )
    total = sum(s.value for s in reg.samples if s.name == "gpuscope_request_duration_seconds_count")
    assert total == 10  # nothing lost, only folded


def test_missing_optional_attributes_leave_labels_empty() -> None:
    spans = SpanFactory(service="svc")
    request = encode([spans.server(0.01)])
    span = request.resource_spans[0].scope_spans[0].spans[0]
    del span.attributes[:]
    aggregator = SpanAggregator()
    assert aggregator.ingest(request).aggregated == 1
    reg = registry_of(aggregator)
    labels = {"service": "svc", "model": "", "route": "", "code": "", "uuid": "", "gpu": ""}
    assert reg.get_sample_value("gpuscope_request_duration_seconds_count", labels) == 1


def stock_server_span(
    scope: str, name: str, attrs: dict[str, AttributeValue], *, error: bool = False
) -> ReadableSpan:
    """A SERVER span as another instrumentation (not gpuscope) would send it."""
    spans = SpanFactory(service="shop")
    span = spans.provider.get_tracer(scope).start_span(
        name, kind=SpanKind.SERVER, attributes=attrs, start_time=T0
    )
    if error:
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=T0 + 30_000_000)
    return spans.memory.get_finished_spans()[-1]


def test_server_spans_of_other_scopes_never_count_as_gpuscope_requests() -> None:
    ours = SpanFactory().server(0.05)
    theirs = stock_server_span(
        "fastapi", "POST /v1/completions", {"http.response.status_code": 200}
    )
    aggregator = SpanAggregator()
    result = aggregator.ingest(encode([ours, theirs]))
    assert (result.received, result.aggregated, result.rejected_total) == (2, 2, 0)
    reg = registry_of(aggregator)
    total = sum(s.value for s in reg.samples if s.name == "gpuscope_request_duration_seconds_count")
    assert total == 1
    assert (
        reg.get_sample_value("gpuscope_span_calls_total", {"span_name": "POST /v1/completions"})
        == 1
    )


@pytest.mark.parametrize(
    "status_attribute", ["http.response.status_code", "http.status_code"], ids=["stable", "old"]
)
def test_stock_spans_keep_every_status_apart(status_attribute: str) -> None:
    aggregator = SpanAggregator()
    statuses = (200, 200, 404, 422, 500, 503)
    spans = [
        stock_server_span(
            "opentelemetry.instrumentation.asgi",
            "GET /items/{id}",
            {status_attribute: code},
            error=code >= 500,
        )
        for code in statuses
    ]
    assert aggregator.ingest(encode(spans)).aggregated == len(statuses)
    reg = registry_of(aggregator)
    calls = [s for s in reg.samples if s.name == "gpuscope_span_calls_total"]
    assert {s.labels["http_status_code"]: s.value for s in calls} == {
        "200": 2, "404": 1, "422": 1, "500": 1, "503": 1,
    }  # fmt: skip
    assert all(s.labels["service_name"] == "shop" for s in calls)
    assert all(s.labels["span_kind"] == "SPAN_KIND_SERVER" for s in calls)
    errors = {
        s.labels["http_status_code"]
        for s in calls
        if s.labels["status_code"] == "STATUS_CODE_ERROR"
    }
    assert errors == {"500", "503"}
    labels = {"span_name": "GET /items/{id}", "http_status_code": "404"}
    assert reg.get_sample_value("gpuscope_span_duration_seconds_count", labels) == 1
    assert reg.get_sample_value("gpuscope_span_duration_seconds_sum", labels) == pytest.approx(0.03)


def test_grpc_server_spans_carry_their_grpc_status() -> None:
    aggregator = SpanAggregator()
    ok = stock_server_span(
        "opentelemetry.instrumentation.grpc", "/svc.Infer/Run", {"rpc.grpc.status_code": 0}
    )
    unavailable = stock_server_span(
        "opentelemetry.instrumentation.grpc",
        "/svc.Infer/Run",
        {"rpc.grpc.status_code": 14},
        error=True,
    )
    assert aggregator.ingest(encode([ok, unavailable])).aggregated == 2
    reg = registry_of(aggregator)
    calls = {
        s.labels["rpc_grpc_status_code"]: (s.labels["status_code"], s.labels["http_status_code"])
        for s in reg.samples
        if s.name == "gpuscope_span_calls_total"
    }
    assert calls == {"0": ("STATUS_CODE_UNSET", ""), "14": ("STATUS_CODE_ERROR", "")}


def test_an_unreadable_stock_status_rejects_the_span_instead_of_merging_it() -> None:
    aggregator = SpanAggregator()
    bad = stock_server_span("asgi", "GET /", {"http.status_code": "two hundred"})
    good = stock_server_span("asgi", "GET /", {"http.status_code": "200"})  # text digits are read
    result = aggregator.ingest(encode([bad, good]))
    assert (result.aggregated, dict(result.rejected)) == (1, {"wrong_attribute_type": 1})
    reg = registry_of(aggregator)
    assert reg.get_sample_value("gpuscope_span_calls_total", {"http_status_code": "200"}) == 1
    assert reg.get_sample_value("gpuscope_span_calls_total", {"http_status_code": ""}) is None


def test_stock_spans_other_than_server_are_received_only() -> None:
    spans = SpanFactory()
    client = spans.provider.get_tracer("httpx").start_span("GET", kind=SpanKind.CLIENT)
    client.end()
    result = SpanAggregator().ingest(encode([spans.memory.get_finished_spans()[-1]]))
    assert (result.received, result.aggregated, result.rejected_total) == (1, 0, 0)


def test_operation_labels_the_request_metrics() -> None:
    spans = SpanFactory()
    chat = spans.server(
        0.05,
        attrs={
            contract.GEN_AI_OPERATION_NAME: "chat",
            contract.TIME_TO_FIRST_TOKEN: 0.01,
            contract.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        },
    )
    embed = spans.server(0.05, attrs={contract.GEN_AI_OPERATION_NAME: "embeddings"})
    aggregator = SpanAggregator()
    aggregator.ingest(encode([chat, embed]))
    reg = registry_of(aggregator)
    for operation in ("chat", "embeddings"):
        labels = {"operation": operation}
        assert reg.get_sample_value("gpuscope_request_duration_seconds_count", labels) == 1
    assert (
        reg.get_sample_value("gpuscope_time_to_first_token_seconds_count", {"operation": "chat"})
        == 1
    )
    tokens = {"operation": "chat", "direction": "output"}
    assert reg.get_sample_value("gpuscope_tokens_total", tokens) == 5


def test_latency_buckets_reach_the_genai_upper_bound() -> None:
    aggregator = SpanAggregator()
    aggregator.ingest(encode([SpanFactory().server(75.0)]))
    reg = registry_of(aggregator)
    bucket = "gpuscope_request_duration_seconds_bucket"
    assert reg.get_sample_value(bucket, {"le": "60.0"}) == 0
    assert reg.get_sample_value(bucket, {"le": "81.92"}) == 1
    assert reg.get_sample_value(bucket, {"le": "0.0001"}) == 0  # the low end stays


def test_overflow_keeps_phase_and_direction_so_their_sums_stay_exact() -> None:
    spans = SpanFactory(service="svc")
    phases = {"queue": 0.001, "batch_wait": 0.002, "compute": 0.01}
    tokens = {contract.GEN_AI_USAGE_INPUT_TOKENS: 3, contract.GEN_AI_USAGE_OUTPUT_TOKENS: 7}
    aggregator = SpanAggregator(max_series=20)
    for chunk in range(10):  # 1,000 requests, each of its own model and route
        aggregator.ingest(
            encode(
                spans.server(0.02, route=f"/r{i}", phases=phases, attrs=tokens | {
                    contract.GEN_AI_REQUEST_MODEL: f"model-{i}"})
                for i in range(chunk * 100, chunk * 100 + 100)
            )
        )  # fmt: skip
    assert aggregator.phase.overflowed > 900
    reg = registry_of(aggregator)
    for phase in phases:
        counts = [
            s.value
            for s in reg.samples
            if s.name == "gpuscope_request_phase_seconds_count" and s.labels["phase"] == phase
        ]
        assert sum(counts) == 1000  # exact per phase, although most were folded
        folded = {"phase": phase, "service": OVERFLOW, "model": OVERFLOW, "uuid": OVERFLOW}
        in_overflow = reg.get_sample_value(
            "gpuscope_request_phase_seconds_count", folded | {"gpu": ""}
        )
        assert in_overflow is not None and in_overflow > 900
    for direction, per_request in (("input", 3), ("output", 7)):
        total = sum(
            s.value
            for s in reg.samples
            if s.name == "gpuscope_tokens_total" and s.labels["direction"] == direction
        )
        assert total == 1000 * per_request
    assert len(aggregator.phase) <= 20 + len(contract.PHASES)  # the cap, plus one per phase


POD_RESOURCE: dict[str, AttributeValue] = {
    "k8s.pod.name": "vllm-0",
    "k8s.namespace.name": "serving",
}
NO_UUID: dict[str, AttributeValue] = {contract.GPU_UUID: ""}


def _served(
    resource: Mapping[str, AttributeValue] | None, attrs: Mapping[str, AttributeValue]
) -> str:
    spans = SpanFactory(service="svc", resource=resource)
    batch = [
        spans.server(
            0.05, phases={"queue": 0.01}, attrs={**attrs, contract.TIME_TO_FIRST_TOKEN: 0.02}
        ),
        spans.batch(4, attrs=attrs),
    ]
    aggregator = SpanAggregator()
    assert aggregator.ingest(encode(batch)).aggregated == 2
    return render_histograms(aggregator.histograms, openmetrics=False)


def test_the_pod_of_spans_that_name_no_gpu_labels_their_request_series() -> None:
    text = _served(POD_RESOURCE, NO_UUID)
    pod = {"namespace": "serving", "pod": "vllm-0", "uuid": "", "gpu": ""}
    parsed = samples(text)
    for name in (
        "gpuscope_request_duration_seconds_count",
        "gpuscope_request_phase_seconds_count",
        "gpuscope_time_to_first_token_seconds_count",
        "gpuscope_batch_size_count",
    ):
        assert value(parsed, name, pod) == 1, name
    # the same spans from no pod: the series as they were, no pod labels at all
    plain = _served(None, NO_UUID)
    assert "pod=" not in plain and "namespace=" not in plain
    assert plain == text.replace(',namespace="serving",pod="vllm-0"', "")


def test_spans_that_name_their_gpu_keep_no_pod_labels() -> None:
    # the series names its GPU already: no join needed, and no series per pod name
    assert _served(POD_RESOURCE, {}) == _served(None, {})


def test_a_namespace_or_a_pod_alone_names_no_pod() -> None:
    # the rules join on both: a pod's name is unique only within its namespace
    assert _served({"k8s.namespace.name": "serving"}, NO_UUID) == _served(None, NO_UUID)
    assert _served({"k8s.pod.name": "vllm-0"}, NO_UUID) == _served(None, NO_UUID)


def test_pods_past_the_series_cap_fold_into_the_overflow_series() -> None:
    aggregator = SpanAggregator(max_series=2)
    for i in range(4):
        spans = SpanFactory(service="svc", resource={**POD_RESOURCE, "k8s.pod.name": f"p-{i}"})
        aggregator.ingest(encode([spans.server(0.01, attrs=NO_UUID)]))
    assert len(aggregator.duration) == 3
    text = render_histograms([aggregator.duration], openmetrics=False)
    assert 'namespace="__overflow__",pod="__overflow__"' in text
    assert {'pod="p-0"' in text, 'pod="p-1"' in text, 'pod="p-2"' in text} == {True, False}


def test_a_pod_name_of_the_wrong_type_rejects_its_resource_spans() -> None:
    spans = SpanFactory(service="svc", resource={**POD_RESOURCE, "k8s.pod.name": 7})
    result = SpanAggregator().ingest(encode([spans.server(0.01, attrs=NO_UUID)]))
    assert result.rejected == {"wrong_attribute_type": 1}
