"""OTLP/JSON bodies that break JSON or protobuf's JSON mapping, sent to a real exporter:
each is a 400 with a ``google.rpc.Status`` body and counted as ``invalid_json``."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from google.rpc import code_pb2  # type: ignore[import-untyped]

from gpuscope.exporter.service import RunningExporter
from support.exporter_fixtures import post_spans, samples, scrape, value


def _span_body(span: str) -> bytes:
    return ('{"resourceSpans":[{"scopeSpans":[{"spans":[' + span + "]}]}]}").encode()


HOSTILE_BODIES = {
    "integer of 5,000 digits": _span_body('{"startTimeUnixNano":' + "9" * 5000 + "}"),
    "kind 1e400": _span_body('{"kind":1e400}'),
    "status code 1e400": _span_body('{"status":{"code":1e400}}'),
    "kind NaN": _span_body('{"kind":NaN}'),
    "lone surrogate key": b'{"\\ud800": 1}',
    "lone surrogate value": _span_body('{"name":"\\udcff"}'),
    "deep nesting": b'{"resourceSpans":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nesting past the depth limit": _span_body('{"attributes":' + "[" * 80 + "]" * 80 + "}"),
    "spans is an object": b'{"resourceSpans":[{"scopeSpans":[{"spans":{"a":1}}]}]}',
    "span is a number": _span_body("7"),
    "trace id is an object": _span_body('{"traceId":{"a":1}}'),
    "kind out of range": _span_body('{"kind":1e300}'),
    "not UTF-8": b'{"resourceSpans":"\xff\xfe"}',
    "top level is a list": b"[]",
}


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
async def test_hostile_json_is_a_counted_400_with_a_status_body(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession, body: bytes
) -> None:
    status, answer = await post_spans(
        exporter_http, running_exporter, body, content_type="application/json"
    )
    assert status == 400, answer[:300]
    rpc_status = json.loads(answer)
    assert rpc_status["code"] == code_pb2.INVALID_ARGUMENT and rpc_status["message"]
    scraped = samples(await scrape(exporter_http, running_exporter))
    rejected = "gpuscope_otlp_requests_rejected_total"
    assert value(scraped, rejected, {"reason": "invalid_json"}) == 1
    assert value(scraped, "gpuscope_spans_received_total") == 0


async def test_an_upload_cut_off_mid_body_is_counted(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    _, writer = await asyncio.open_connection(running_exporter.host, running_exporter.port)
    writer.write(
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        b"Content-Length: 100\r\n\r\n0123456789"
    )
    await writer.drain()
    writer.close()
    rejected = "gpuscope_otlp_requests_rejected_total"
    for _ in range(3000):  # the exporter notices the closed connection in its own time
        scraped = samples(await scrape(exporter_http, running_exporter))
        if value(scraped, rejected, {"reason": "incomplete_body"}) == 1:
            break
        await asyncio.sleep(0.01)
    assert value(scraped, rejected, {"reason": "incomplete_body"}) == 1
