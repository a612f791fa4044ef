"""What a real vLLM sent (the captured fixtures) through a real exporter, over HTTP.

Each request is counted once in ``gpuscope_request_*`` whichever way vLLM was run:
from gpuscope's server span when the middleware is there (vLLM's ``llm_request``, then
marked as counted, only adds its phases through the middleware), from ``llm_request``
when vLLM traces alone, and from the server span alone when vLLM does not trace. The
export requests are replayed in every order, since the two spans of one request may
arrive in different export requests, or one of them never.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.samples import Sample

from gpuscope import engine_spans
from gpuscope.exporter.service import RunningExporter
from support.exporter_fixtures import post_spans, samples, scrape
from support.vllm_fixtures import export_requests, spans

SERVER = 2  # SPAN_KIND_SERVER


def total(scraped: Sequence[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in scraped if s.name == name and labels.items() <= s.labels.items())


async def replay(
    session: aiohttp.ClientSession, exporter: RunningExporter, service: str, seed: int
) -> None:
    requests = export_requests(service)
    random.Random(seed).shuffle(requests)
    for request in requests:
        status, body = await post_spans(session, exporter, request.SerializeToString())
        assert status == 200, body


def counted_requests(service: str) -> int:
    """Requests vLLM served in the capture: its llm_request spans, else gpuscope's server spans."""
    engine = [s for _, s in spans(service) if s.name == engine_spans.VLLM_REQUEST_SPAN]
    if engine:
        return len(engine)
    return len([s for scope, s in spans(service) if scope == "gpuscope" and s.kind == SERVER])


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_middleware_and_vllm_tracing_count_each_request_once(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession, seed: int
) -> None:
    await replay(exporter_http, running_exporter, "vllm-both", seed)
    scraped = samples(await scrape(exporter_http, running_exporter))
    served = counted_requests("vllm-both")
    model_requests = total(
        scraped, "gpuscope_request_duration_seconds_count", service="vllm-both", model="tiny"
    )
    assert model_requests == served
    for phase in ("queue", "compute"):
        assert total(scraped, "gpuscope_request_phase_seconds_count", phase=phase) == served
    for stage in ("prefill", "decode"):
        assert total(scraped, "gpuscope_request_compute_stage_seconds_count", stage=stage) == served
    assert total(scraped, "gpuscope_request_phase_seconds_count", phase="batch_wait") == 0
    # vLLM's span is still another instrumentation's SERVER span, in the spanmetrics family.
    assert total(scraped, "gpuscope_span_calls_total", span_name="llm_request") == served


@pytest.mark.parametrize("seed", [0, 1])
async def test_vllm_tracing_alone_counts_from_llm_request(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession, seed: int
) -> None:
    await replay(exporter_http, running_exporter, "vllm-traces", seed)
    scraped = samples(await scrape(exporter_http, running_exporter))
    served = counted_requests("vllm-traces")
    attributes = [
        {kv.key for kv in s.attributes} for _, s in spans("vllm-traces") if s.name == "llm_request"
    ]
    assert all(engine_spans.COUNTED_BY_SERVER_SPAN not in keys for keys in attributes)
    assert (
        total(scraped, "gpuscope_request_duration_seconds_count", service="vllm-traces") == served
    )
    assert total(scraped, "gpuscope_request_phase_seconds_count", phase="queue") == served
    assert total(scraped, "gpuscope_time_to_first_token_seconds_count") == served
    tokens_out = sum(
        kv.value.int_value
        for _, s in spans("vllm-traces")
        for kv in s.attributes
        if kv.key == engine_spans.VLLM_COMPLETION_TOKENS
    )
    assert total(scraped, "gpuscope_tokens_total", direction="output") == tokens_out
    # vLLM's span names no model: the label stays empty (docs/engines/vllm.md)
    assert total(scraped, "gpuscope_request_duration_seconds_count", model="tiny") == 0


async def test_middleware_alone_counts_requests_without_phases(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    await replay(exporter_http, running_exporter, "vllm-middleware", 0)
    scraped = samples(await scrape(exporter_http, running_exporter))
    served = counted_requests("vllm-middleware")
    assert served > 0
    assert (
        total(
            scraped,
            "gpuscope_request_duration_seconds_count",
            service="vllm-middleware",
            model="tiny",
        )
        == served
    )
    assert total(scraped, "gpuscope_request_phase_seconds_count") == 0


async def test_vllm_loading_spans_are_received_not_counted(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    """vLLM also traces model loading (INTERNAL spans of other scopes): received only."""
    loading = [s for scope, s in spans("vllm-traces") if s.kind != SERVER]
    await replay(exporter_http, running_exporter, "vllm-traces", 0)
    scraped = samples(await scrape(exporter_http, running_exporter))
    assert total(scraped, "gpuscope_spans_received_total") == len(spans("vllm-traces"))
    assert total(scraped, "gpuscope_spans_rejected_total") == 0
    assert total(scraped, "gpuscope_span_calls_total") == len(spans("vllm-traces")) - len(loading)


@pytest.mark.parametrize(
    ("key", "field", "value", "reason"),
    [
        (engine_spans.VLLM_QUEUE, "double_value", -1.0, "invalid_duration"),
        (engine_spans.VLLM_DECODE, "double_value", float("inf"), "invalid_duration"),
        (engine_spans.VLLM_TTFT, "double_value", 1.7e308, "invalid_duration"),
        (engine_spans.VLLM_QUEUE, "double_value", 86_400.5, "invalid_duration"),
        (engine_spans.VLLM_PREFILL, "string_value", "0.1", "wrong_attribute_type"),
        (engine_spans.VLLM_PROMPT_TOKENS, "int_value", -5, "invalid_attribute_value"),
        ("http.response.status_code", "string_value", "oops", "wrong_attribute_type"),
    ],
)
async def test_a_broken_engine_span_is_rejected_whole(
    running_exporter: RunningExporter,
    exporter_http: aiohttp.ClientSession,
    key: str,
    field: str,
    value: object,
    reason: str,
) -> None:
    """One bad value rejects the span with a reason, and nothing of it is counted."""
    captured = next(
        (rs, ss, span)
        for r in export_requests("vllm-traces")
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == engine_spans.VLLM_REQUEST_SPAN
    )
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.CopyFrom(captured[0].resource)
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.CopyFrom(captured[1].scope)
    span = scope_spans.spans.add()
    span.CopyFrom(captured[2])
    existing = [kv for kv in span.attributes if kv.key == key]
    kv = existing[0] if existing else span.attributes.add(key=key)
    kv.value.Clear()
    setattr(kv.value, field, value)
    status, _ = await post_spans(exporter_http, running_exporter, request.SerializeToString())
    assert status == 200  # partial success: the rejection is in the body and the metrics
    scraped = samples(await scrape(exporter_http, running_exporter))
    assert total(scraped, "gpuscope_spans_rejected_total", reason=reason) == 1
    assert total(scraped, "gpuscope_request_duration_seconds_count") == 0
    assert total(scraped, "gpuscope_request_phase_seconds_count") == 0
    assert total(scraped, "gpuscope_span_calls_total") == 0
