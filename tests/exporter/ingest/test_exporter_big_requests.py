"""Small requests that decode into something huge, over real sockets: past the span or
attribute cap they are refused (413, counted) before they are decoded; under it they
are decoded in the ingest thread while /healthz is answered, and a shutdown does not
wait for them, nor counts what it answered 503."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import loopback_config, post_spans, samples, scrape, value

REJECTED = "gpuscope_otlp_requests_rejected_total"
JSON = {"Content-Type": "application/json"}
GZIP = {"Content-Encoding": "gzip"}


def entry(field: int, payload: bytes = b"") -> bytes:
    """One length-delimited protobuf field."""
    length, size = bytearray(), len(payload)
    while True:
        length.append(size & 0x7F | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            return bytes([field << 3 | 2]) + bytes(length) + payload


def one_scope(spans: bytes) -> bytes:
    """An ExportTraceServiceRequest of one resource and one scope holding ``spans``
    (encoded entries of ScopeSpans.spans)."""
    return entry(1, entry(2, spans))


BOMBS: dict[str, tuple[Callable[[], bytes], dict[str, str], str]] = {
    # the 2,982-byte body: a million empty OTLP/JSON spans, a million and some
    # JSON objects, so the JSON value cap refuses it before it is parsed
    "json-million-spans": (
        lambda: b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + b"{}," * 10**6 + b"{}]}]}]}",
        JSON,
        "too_many_json_values",
    ),
    # 200,001 empty OTLP/JSON spans: under the value cap, over the span cap
    "json-spans": (
        lambda: b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + b"{}," * 200_000 + b"{}]}]}]}",
        JSON,
        "too_many_spans",
    ),
    # 6.5 million empty arrays in one attribute value (7 million took 74 s of protobuf's
    # JSON mapping and a GiB before the JSON value cap)
    "json-values": (
        lambda: (
            b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"k",'
            + b'"value":{"arrayValue":{"values":['
            + b"[]," * 6_500_000
            + b"[]]}}}]}]}]}]}"
        ),
        JSON,
        "too_many_json_values",
    ),
    # 9 million empty protobuf spans: 18 MB, under --max-decompressed-bytes
    "protobuf-spans": (lambda: one_scope(entry(2) * 9_000_000), {}, "too_many_spans"),
    # as many empty resource groups instead
    "protobuf-groups": (lambda: entry(1) * 9_000_000, {}, "too_many_spans"),
    # one span with a million and one empty attributes (Span field 9)
    "protobuf-attributes": (
        lambda: one_scope(entry(2, entry(9) * 1_000_001)),
        {},
        "too_many_attributes",
    ),
}


# A 10,000-span OTLP/JSON request takes seconds to decode on a busy machine: past the
# default decode budget and ingest timeout, which ``test_exporter_fair_ingest`` covers.
PATIENT = {"max_decode_cpu_s": 120.0, "ingest_timeout_s": 120.0}


@pytest.fixture
async def exporter() -> AsyncIterator[RunningExporter]:
    running = await start_exporter(loopback_config(**PATIENT))
    try:
        yield running
    finally:
        await running.stop()


@pytest.mark.parametrize("bomb", sorted(BOMBS))
async def test_past_the_caps_a_request_is_refused_before_it_is_aggregated(
    exporter: RunningExporter, exporter_http: aiohttp.ClientSession, bomb: str
) -> None:
    make, headers, reason = BOMBS[bomb]
    body = gzip.compress(make(), compresslevel=1)
    assert len(body) < 100_000  # small as sent
    status, _ = await post_spans(exporter_http, exporter, body, headers=headers | GZIP)
    assert status == 413
    scraped = samples(await scrape(exporter_http, exporter))
    assert value(scraped, REJECTED, {"reason": reason}) == 1
    assert value(scraped, "gpuscope_spans_received_total") == 0


@functools.cache
def json_spans(spans: int, attributes: int = 5) -> bytes:
    """Gzipped OTLP/JSON of ``spans`` valid spans of ``attributes`` int attributes:
    protobuf's JSON mapping, in Python, takes about 70 µs a span of it here."""
    listed = [
        {
            "traceId": "0" * 31 + "1",
            "spanId": f"{n + 1:016x}",  # ids of their own: a repeated span counts once
            "name": "x",
            "kind": 2,  # SERVER, of no gpuscope scope: counted as a stock span
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            "attributes": [{"key": f"k{a}", "value": {"intValue": "1"}} for a in range(attributes)],
        }
        for n in range(spans)
    ]
    document = {"resourceSpans": [{"scopeSpans": [{"spans": listed}]}]}
    return gzip.compress(json.dumps(document).encode(), compresslevel=1)


async def post_in_background(exporter: RunningExporter, body: bytes) -> asyncio.Task[int]:
    """Posts ``body`` (gzipped OTLP/JSON) and returns once the ingest thread has it."""

    async def post() -> int:
        async with aiohttp.ClientSession() as session:
            return (await post_spans(session, exporter, body, headers=JSON | GZIP))[0]

    task = asyncio.ensure_future(post())
    ingest = exporter.app[STATE].ingest
    for _ in range(3000):
        if ingest.pending:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the request never reached the ingest thread")


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_health_checks_are_answered_while_a_large_request_is_decoded(
    exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    """Before, decoding ran on the event loop: /healthz waited for all of it."""
    upload = await post_in_background(exporter, json_spans(10_000))
    async with exporter_http.get(exporter.url + "/healthz") as response:
        assert response.status == 200
    assert exporter.app[STATE].ingest.pending == 1  # answered while it was decoded
    assert await upload == 200
    scraped = samples(await scrape(exporter_http, exporter))
    assert value(scraped, "gpuscope_spans_received_total") == 10_000
    assert value(scraped, "gpuscope_span_calls_total") == 10_000


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_a_shutdown_does_not_wait_for_a_decode_and_never_counts_what_it_refused(
    exporter_http: aiohttp.ClientSession,
) -> None:
    exporter = await start_exporter(loopback_config(shutdown_timeout_s=0.2, **PATIENT))
    upload = await post_in_background(exporter, json_spans(10_000))
    await exporter.stop()  # the shutdown timeout runs out during the decode
    assert await upload == 503
    state = exporter.app[STATE]
    for _ in range(3000):  # the ingest thread finishes decoding, then drops it
        if not state.ingest.pending:
            break
        await asyncio.sleep(0.01)
    assert state.ingest.pending == 0
    assert len(state.aggregator.stock.calls) == 0 and state.metrics.spans_received == 0
    assert state.metrics.requests_rejected["shutting_down"] == 1
