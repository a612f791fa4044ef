"""The exporter as a real server on 127.0.0.1: SDK exporter in, /metrics out, bad input."""

from __future__ import annotations

import asyncio
import gzip
import math
import os
from collections.abc import Sequence

import aiohttp
import pytest
from google.rpc.status_pb2 import Status  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from gpuscope import spans as contract
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import (
    FakeGpuSource,
    SpanFactory,
    encode,
    loopback_config,
    post_spans,
    samples,
    scrape,
    value,
)

BASE = {"service": "test-worker", "model": "m1", "uuid": "GPU-aaaa", "gpu": ""}
DURATION = {**BASE, "route": "/v1/completions", "code": "200"}


async def sdk_export(
    exporter: RunningExporter, spans: Sequence[ReadableSpan], compression: Compression
) -> SpanExportResult:
    """Send with the SDK's own OTLP/HTTP exporter (synchronous, so in a thread)."""
    sdk = OTLPSpanExporter(endpoint=exporter.url + "/v1/traces", compression=compression)
    try:
        return await asyncio.to_thread(sdk.export, spans)
    finally:
        sdk.shutdown()  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
async def test_sdk_exporter_spans_become_histograms_sample_by_sample(
    running_exporter: RunningExporter,
    exporter_http: aiohttp.ClientSession,
    compression: Compression,
) -> None:
    spans = SpanFactory()
    sent = [
        spans.server(0.003, phases={"queue": 0.0002, "compute": 0.002}),
        spans.server(0.2, phases={"queue": 0.15, "compute": 0.04}),
        spans.server(0.7, code=500),
        spans.internal("gpuscope.queue"),
    ]
    assert await sdk_export(running_exporter, sent, compression=compression) is (
        SpanExportResult.SUCCESS
    )
    scraped = samples(await scrape(exporter_http, running_exporter))
    bucket = "gpuscope_request_duration_seconds_bucket"
    expected_buckets = {"0.0025": 0, "0.005": 1, "0.1": 1, "0.25": 2, "0.5": 2, "1.0": 2}
    for le, count in expected_buckets.items():
        assert value(scraped, bucket, {**DURATION, "le": le}) == count, le
    assert value(scraped, bucket, {**DURATION, "le": "+Inf"}) == 2
    assert value(scraped, "gpuscope_request_duration_seconds_count", DURATION) == 2
    assert value(scraped, "gpuscope_request_duration_seconds_sum", DURATION) == pytest.approx(0.203)
    assert value(scraped, "gpuscope_request_duration_seconds_count", {**DURATION, "code": "500"})
    queue = {**BASE, "phase": "queue"}
    assert value(scraped, "gpuscope_request_phase_seconds_count", queue) == 2
    assert value(scraped, "gpuscope_request_phase_seconds_bucket", {**queue, "le": "0.00025"}) == 1
    assert value(scraped, "gpuscope_request_phase_seconds_sum", queue) == pytest.approx(0.1502)
    assert value(scraped, "gpuscope_spans_received_total") == 4
    assert value(scraped, "gpuscope_build_info") == 1


async def test_partial_success_for_bad_spans_and_the_good_ones_count(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    spans = SpanFactory()
    good = spans.server(0.01)
    bad = spans.server(0.01, attrs={contract.PHASE_DURATION["queue"]: math.nan})
    worse = spans.server(0.01, attrs={contract.GEN_AI_REQUEST_MODEL: "x" * 1000})
    body = encode([good, bad, worse]).SerializeToString()
    status, answer = await post_spans(exporter_http, running_exporter, body)
    assert status == 200
    response = ExportTraceServiceResponse.FromString(answer)
    assert response.partial_success.rejected_spans == 2
    assert "invalid_duration=1" in response.partial_success.error_message
    assert "invalid_label=1" in response.partial_success.error_message
    scraped = samples(await scrape(exporter_http, running_exporter))
    assert value(scraped, "gpuscope_request_duration_seconds_count", DURATION) == 1
    rejected = "gpuscope_spans_rejected_total"
    assert value(scraped, rejected, {"reason": "invalid_duration"}) == 1
    assert value(scraped, rejected, {"reason": "invalid_label"}) == 1
    assert value(scraped, rejected, {"reason": "wrong_attribute_type"}) == 0


async def test_durations_past_a_day_are_refused_so_a_sum_cannot_become_infinite(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    """Two spans with a TTFT of 1.7e308 used to be accepted and made ``_sum`` +Inf until
    restart; now they are rejected with a reason, and a day exactly still counts."""
    spans = SpanFactory()
    poison = [spans.server(0.01, attrs={contract.TIME_TO_FIRST_TOKEN: 1.7e308}) for _ in range(2)]
    longest = spans.server(86_400.0, attrs={contract.TIME_TO_FIRST_TOKEN: 86_400.0})
    for sent in (poison, [longest]):
        body = encode(sent).SerializeToString()
        assert (await post_spans(exporter_http, running_exporter, body))[0] == 200
    scraped = samples(await scrape(exporter_http, running_exporter))
    ttft = "gpuscope_time_to_first_token_seconds"
    assert value(scraped, ttft + "_count") == 1
    assert value(scraped, ttft + "_sum") == 86_400.0
    assert value(scraped, "gpuscope_spans_rejected_total", {"reason": "invalid_duration"}) == 2


def _bomb() -> bytes:
    return gzip.compress(b"\0" * (8 << 20))


@pytest.mark.parametrize(
    ("body", "headers", "status", "reason"),
    [
        (os.urandom(4096), {}, 400, "invalid_protobuf"),
        (b'{"resourceSpans": [', {"Content-Type": "application/json"}, 400, "invalid_json"),
        (b"hello", {"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        (os.urandom(300_000), {}, 413, "body_too_large"),
        (_bomb(), {"Content-Encoding": "gzip"}, 413, "decompressed_too_large"),
        (b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}, 400, "invalid_gzip"),
        (b"", {"Content-Encoding": "zstd"}, 415, "unsupported_encoding"),
    ],
)
async def test_bad_requests_get_a_reason_are_counted_and_the_exporter_keeps_serving(
    exporter_http: aiohttp.ClientSession,
    body: bytes,
    headers: dict[str, str],
    status: int,
    reason: str,
) -> None:
    config = loopback_config(max_body_bytes=200_000, max_decompressed_bytes=1 << 20)
    exporter = await start_exporter(config)
    try:
        got, answer = await post_spans(exporter_http, exporter, body, headers=headers)
        assert got == status
        if headers.get("Content-Type") != "application/json":
            assert Status.FromString(answer).message  # the reason, in words
        scraped = samples(await scrape(exporter_http, exporter))
        assert value(scraped, "gpuscope_otlp_requests_rejected_total", {"reason": reason}) == 1
        # Still serving: a valid request right after is counted.
        good = encode([SpanFactory().server(0.01)]).SerializeToString()
        assert (await post_spans(exporter_http, exporter, good))[0] == 200
        scraped = samples(await scrape(exporter_http, exporter))
        assert value(scraped, "gpuscope_request_duration_seconds_count", DURATION) == 1
    finally:
        await exporter.stop()


async def test_concurrent_senders_every_span_counted_exactly_once(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    senders, requests_each, spans_each = 6, 20, 25
    spans = SpanFactory()
    # every request its own spans: the exporter counts a span id once
    bodies = [
        [
            encode(
                [spans.server(0.01, phases={"compute": 0.005}) for _ in range(spans_each)]
            ).SerializeToString()
            for _ in range(requests_each)
        ]
        for _ in range(senders)
    ]

    async def sender(mine: list[bytes]) -> None:
        async with aiohttp.ClientSession() as session:  # one connection pool per client
            for body in mine:
                status, _ = await post_spans(session, running_exporter, body)
                assert status == 200

    await asyncio.gather(*(sender(mine) for mine in bodies))
    expected = senders * requests_each * spans_each
    scraped = samples(await scrape(exporter_http, running_exporter))
    assert value(scraped, "gpuscope_request_duration_seconds_count", DURATION) == expected
    compute = {**BASE, "phase": "compute"}
    assert value(scraped, "gpuscope_request_phase_seconds_count", compute) == expected
    assert value(scraped, "gpuscope_spans_received_total") == expected


async def test_openmetrics_scrape_has_exemplars_and_gzip_is_honoured(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    span = SpanFactory().server(0.003, phases={"queue": 0.0002})
    await post_spans(exporter_http, running_exporter, encode([span]).SerializeToString())
    text = await scrape(
        exporter_http, running_exporter, accept="application/openmetrics-text; version=1.0.0"
    )
    assert text.endswith("# EOF\n")
    exemplars = [
        s.exemplar
        for s in samples(text, openmetrics=True)
        if s.name == "gpuscope_request_duration_seconds_bucket" and s.exemplar is not None
    ]
    assert len(exemplars) == 1
    assert exemplars[0].labels == {
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
    }
    assert exemplars[0].value == pytest.approx(0.003)
    headers = {"Accept-Encoding": "gzip"}
    url = running_exporter.url + "/metrics"
    async with exporter_http.get(url, headers=headers, auto_decompress=False) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert b"gpuscope_request_duration_seconds" in gzip.decompress(await response.read())


async def test_gpu_source_is_polled_joined_and_told_about_batches(
    exporter_http: aiohttp.ClientSession,
) -> None:
    source = FakeGpuSource()
    exporter = await start_exporter(
        loopback_config(gpu_interval_s=0.05), gpu_source=source, compute_observers=[source]
    )
    try:
        async with exporter_http.get(exporter.url + "/healthz") as response:
            assert response.status == 200
        poller = exporter.app[STATE].poller
        assert poller is not None
        assert await asyncio.to_thread(poller.wait_for_round, 1, 10.0)
        async with exporter_http.get(exporter.url + "/readyz") as response:
            assert response.status == 200
        spans = SpanFactory()
        members = [spans.server(0.01, attrs={contract.GPU_UUID: "GPU-bbbb"}) for _ in range(2)]
        batch = spans.batch(2, links=members, attrs={contract.GPU_UUID: "GPU-bbbb"})
        await post_spans(exporter_http, exporter, encode([*members, batch]).SerializeToString())
        scraped = samples(await scrape(exporter_http, exporter))
        joined = {**DURATION, "uuid": "GPU-bbbb", "gpu": "1"}
        assert value(scraped, "gpuscope_request_duration_seconds_count", joined) == 2
        assert value(scraped, "gpuscope_gpu_up", {"uuid": "GPU-bbbb"}) == 1
        assert value(scraped, "gpuscope_collector_success", {"collector": "fake"}) == 1
        assert [(uuid, size) for uuid, _, size, _ in source.compute] == [("GPU-bbbb", 2)]
    finally:
        await exporter.stop()
    assert source.closed.is_set()


async def test_stop_closes_the_listener(exporter_http: aiohttp.ClientSession) -> None:
    exporter = await start_exporter(loopback_config())
    async with exporter_http.get(exporter.url + "/readyz") as response:
        assert response.status == 200
    await exporter.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with exporter_http.get(exporter.url + "/readyz"):
            pass


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_a_scrape_larger_than_a_chunk_arrives_whole(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    spans = SpanFactory()
    batch = [
        spans.server(0.01, route=f"/r{i}", attrs={contract.GEN_AI_REQUEST_MODEL: f"m{i}"})
        for i in range(800)
    ]
    body = encode(batch).SerializeToString()
    assert (await post_spans(exporter_http, running_exporter, body))[0] == 200
    text = await scrape(exporter_http, running_exporter)
    assert len(text) > 1 << 20  # past one write chunk
    scraped = samples(text)
    counts = [s.value for s in scraped if s.name == "gpuscope_request_duration_seconds_count"]
    assert len(counts) == 800 and sum(counts) == 800


async def expect_continue(exporter: RunningExporter, length: int) -> bytes:
    """Sends a head with ``Expect: 100-continue`` and no body; the first line answered."""
    reader, writer = await asyncio.open_connection(exporter.host, exporter.port)
    try:
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        return await asyncio.wait_for(reader.readline(), 30)
    finally:
        writer.close()


async def test_expect_100_continue_over_the_limit_gets_413_at_once_and_under_it_continue(
    exporter_http: aiohttp.ClientSession,
) -> None:
    """Before, a declared length over --max-body-bytes was invited with ``100 Continue``
    and refused only once the client had sent the body."""
    exporter = await start_exporter(loopback_config(max_body_bytes=1000))
    try:
        assert (await expect_continue(exporter, 1001)).startswith(b"HTTP/1.1 413")
        assert (await expect_continue(exporter, 1000)) == b"HTTP/1.1 100 Continue\r\n"
        scraped = samples(await scrape(exporter_http, exporter))
        rejected = "gpuscope_otlp_requests_rejected_total"
        assert value(scraped, rejected, {"reason": "body_too_large"}) == 1
    finally:
        await exporter.stop()


async def continued_exchange(exporter: RunningExporter, body: bytes) -> tuple[bytes, bytes]:
    """``Expect: 100-continue``, the body once invited; the interim line and the answer."""
    reader, writer = await asyncio.open_connection(exporter.host, exporter.port)
    try:
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return interim, head + await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()


async def test_after_100_continue_the_answer_is_whole_and_an_error_still_answered() -> None:
    """The interim answer goes out beside the response's writer, so the answer that
    follows is a response of its own: its length is its body's, and a refused body is
    still answered (aiohttp answers an error only while nothing of the response is out)."""
    exporter = await start_exporter(loopback_config())
    try:
        good = encode([SpanFactory().server()]).SerializeToString()
        interim, answer = await continued_exchange(exporter, good)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert answer.startswith(b"HTTP/1.1 200")
        ExportTraceServiceResponse.FromString(answer.split(b"\r\n\r\n", 1)[1])
        interim, answer = await continued_exchange(exporter, b"\xff" * 16)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert answer.startswith(b"HTTP/1.1 400")
    finally:
        await exporter.stop()


async def test_metrics_negotiation_survives_odd_headers_and_says_what_it_varies_by(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    """A malformed ``version=`` was a 500 and a logged traceback for any client, and
    ``gzip;q=0`` got gzip; a cache in between is told the answer varies by both."""
    url = running_exporter.url + "/metrics"
    cases = [
        ({"Accept": "application/openmetrics-text; version=abc"}, "text/plain; version=0.0.4"),
        ({"Accept": "text/plain; version=x"}, "text/plain; version=0.0.4"),
        ({"Accept": "Application/OpenMetrics-Text; version=1.0.0"}, "application/openmetrics"),
    ]
    for headers, content_type in cases:
        async with exporter_http.get(url, headers=headers) as response:
            assert response.status == 200, headers
            assert response.headers["Content-Type"].startswith(content_type), headers
            assert response.headers["Vary"] == "Accept, Accept-Encoding"
            await response.read()
    refused = {"Accept-Encoding": "gzip;q=0"}
    async with exporter_http.get(url, headers=refused, auto_decompress=False) as response:
        assert "Content-Encoding" not in response.headers
        assert b"# HELP" in await response.read()
