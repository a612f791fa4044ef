"""Property-based fuzzing of OTLP decode + aggregation: no input raises, every refused
request has a counted reason, every span is aggregated or rejected with a reason, and
what was aggregated still renders as a valid exposition. The long run (100,000+ cases)
is ``benchmarks/otlp_fuzz.py``."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.http.render import render_histograms
from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.aggregator import SpanAggregator
from gpuscope.exporter.service import RunningExporter, start_exporter
from support.exporter_fixtures import post_spans, samples, scrape, value
from support.otlp_cases import (
    Case,
    capped_config,
    check_case,
    check_sums,
    json_text,
    random_case,
    random_request,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _renders(aggregator: SpanAggregator) -> None:
    check_sums(aggregator)
    text = render_histograms(aggregator.histograms, openmetrics=False)
    families = list(text_string_to_metric_families(text.encode("utf-8").decode()))
    assert len(families) == len(aggregator.histograms)


@FUZZ
@given(st.randoms(use_true_random=False))
@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
def test_mutated_requests_never_raise_and_spans_are_accounted(rng: random.Random) -> None:
    aggregator = SpanAggregator(max_series=8)  # small, so overflow is exercised too
    for _ in range(4):
        check_case(aggregator, random_case(rng))
    _renders(aggregator)


# Any JSON value, including lone surrogates, non-finite floats and big integers.
_SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1)
_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=20)
    | _SURROGATES
)
_JSON_VALUES = st.recursive(
    _JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8) | _SURROGATES, inner, max_size=3)
    ),
    max_leaves=12,
)
_SPAN_FIELDS = st.sampled_from(
    ["kind", "status", "attributes", "traceId", "spanId", "startTimeUnixNano", "name", "links"]
)


@FUZZ
@given(st.randoms(use_true_random=False), _SPAN_FIELDS, _JSON_VALUES, st.integers(0, 70))
@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
def test_any_json_value_in_any_span_field_is_a_400_or_aggregated(
    rng: random.Random, field: str, replacement: Any, depth: int
) -> None:
    request = random_request(rng)
    document = json.loads(json_text(request))
    spans = [
        span
        for resource_spans in document["resourceSpans"]
        for scope_spans in resource_spans.get("scopeSpans", [])
        for span in scope_spans.get("spans", [])
    ]
    for _ in range(depth):
        replacement = [replacement]
    for span in spans[:1]:
        span[field] = replacement
    body = json.dumps(document).encode()  # writes NaN/Infinity and \udXXX escapes as is
    check_case(SpanAggregator(max_series=8), Case(body, otlp.JSON, None, "json-any"))


def test_protobuf_and_json_of_the_same_request_aggregate_alike() -> None:
    rng = random.Random(7)
    for _ in range(50):
        request = random_request(rng)
        by_protobuf, by_json = SpanAggregator(), SpanAggregator()
        first = check_case(by_protobuf, Case(request.SerializeToString(), otlp.PROTOBUF, None, ""))
        second = check_case(by_json, Case(json_text(request).encode(), otlp.JSON, None, ""))
        assert first == second
        assert json_format.MessageToDict(request)  # a request, not an empty shell


@pytest.fixture
async def capped_exporter() -> AsyncIterator[RunningExporter]:
    """An exporter with the fuzz cases' small span and attribute caps."""
    exporter = await start_exporter(capped_config())
    try:
        yield exporter
    finally:
        await exporter.stop()


async def test_fuzzed_requests_over_http_are_answered_and_every_refusal_counted(
    capped_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    rng = random.Random(2026)
    mirror = SpanAggregator()  # what the exporter should have done, case by case
    refused = received = 0
    for _ in range(150):
        case = random_case(rng)
        headers = {"Content-Encoding": case.encoding} if case.encoding else {}
        status, _ = await post_spans(
            exporter_http, capped_exporter, case.body, content_type=case.media, headers=headers
        )
        expected = check_case(mirror, case)
        assert status == expected.status, case
        refused += expected.rejected_reason is not None
        received += expected.received
    scraped = samples(await scrape(exporter_http, capped_exporter))
    counted = sum(s.value for s in scraped if s.name == "gpuscope_otlp_requests_rejected_total")
    assert refused > 20 and counted == refused
    assert value(scraped, "gpuscope_spans_received_total") == received
