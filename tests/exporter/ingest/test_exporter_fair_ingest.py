"""One sender cannot hold everyone's ingest: four connections posting OTLP/JSON bodies
that are slow to decode (each within every cap) while the OpenTelemetry SDK's own
OTLP/HTTP exporter sends from another address; a request is counted only when its
sender is answered 200 (not when it left, nor when its deadline passed)."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import SpanFactory, encode, loopback_config

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

HOSTILE_ADDRESS = "127.0.0.2"  # loopback too: another sender for the exporter


def slow_json_body() -> bytes:
    """2.8 KB of gzip: one span with one attribute of 900,000 empty array values, under
    every cap (a million JSON values) and 7.0 s of protobuf's JSON mapping before."""
    values = b",".join([b"{}"] * 900_000)
    document = (
        b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"'
        + b"1" * 32
        + b'","spanId":"'
        + b"1" * 16
        + b'","name":"x","kind":2,"attributes":[{"key":"k",'
        + b'"value":{"arrayValue":{"values":['
        + values
        + b"]}}}]}]}]}]}"
    )
    json.loads(document)  # well formed
    return gzip.compress(document, 9)


async def post_raw(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, body: bytes
) -> int:
    """One keep-alive OTLP/JSON gzip POST; the answer's status."""
    head = (
        f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, text = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(text)
    await reader.readexactly(length)
    return status


async def hostile_sender(exporter: RunningExporter, body: bytes, answers: Counter[int]) -> None:
    """Posts ``body`` again and again on one connection from another address."""
    while True:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", exporter.port, local_addr=(HOSTILE_ADDRESS, 0)
        )
        try:
            while True:
                answers[await post_raw(reader, writer, exporter.port, body)] += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            continue
        finally:
            writer.close()


@pytest.fixture
async def exporter() -> AsyncIterator[RunningExporter]:
    # a small decode budget, so that the test is quick; the default's figures are in
    # docs/reliability.md
    running = await start_exporter(loopback_config(max_decode_cpu_s=0.2))
    try:
        yield running
    finally:
        await running.stop()


async def test_legitimate_exports_are_answered_in_time_and_counted_once(
    exporter: RunningExporter,
) -> None:
    """Before, each hostile body held the one ingest thread for 7 s of CPU, in the
    order they came: the SDK's exports timed out at 10 s (and were counted later)."""
    answers: Counter[int] = Counter()
    body = slow_json_body()
    attackers = [asyncio.create_task(hostile_sender(exporter, body, answers)) for _ in range(4)]
    sdk = OTLPSpanExporter(endpoint=exporter.url + "/v1/traces", timeout=10)
    factory = SpanFactory()
    try:
        await _in_line(exporter, 4)  # every attacker in line
        took = []
        for _ in range(3):
            batch = [factory.server(0.01) for _ in range(25)]
            started = time.monotonic()
            assert await asyncio.to_thread(sdk.export, batch) is SpanExportResult.SUCCESS
            took.append(time.monotonic() - started)
    finally:
        for attacker in attackers:
            attacker.cancel()
        await asyncio.gather(*attackers, return_exceptions=True)
        sdk.shutdown()  # type: ignore[no-untyped-call]
    state = exporter.app[STATE]
    assert max(took) < 10
    assert state.metrics.spans_received == 75  # each span once
    assert answers[413] >= 4 and set(answers) <= {413}
    # Every 413 an attacker read was counted; an attacker cancelled while its body was
    # decoded may be refused (and counted) after it left: at most one each.
    rejected = state.metrics.requests_rejected["decode_budget"]
    assert answers[413] <= rejected <= answers[413] + len(attackers)


async def _hold_the_thread(exporter: RunningExporter) -> asyncio.Task[int]:
    """A hostile body from another sender, decoded until its budget is spent."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", exporter.port, local_addr=(HOSTILE_ADDRESS, 0)
    )

    async def post() -> int:
        try:
            return await post_raw(reader, writer, exporter.port, slow_json_body())
        finally:
            writer.close()

    task = asyncio.create_task(post())
    await _in_line(exporter, 1)
    return task


async def _in_line(exporter: RunningExporter, requests: int) -> None:
    for _ in range(2000):
        if exporter.app[STATE].ingest.pending >= requests:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the requests did not reach the ingest thread")


async def _ingest_idle(exporter: RunningExporter) -> None:
    for _ in range(2000):
        if not exporter.app[STATE].ingest.pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the ingest thread did not finish")


async def test_a_request_whose_client_left_is_never_counted() -> None:
    """Before, it was decoded and counted once its turn came, though nobody heard it."""
    # The hostile body must still hold the thread when the second request gets in line:
    # with a 1 s budget a loaded machine once let it finish first (a fresh-clone run).
    exporter = await start_exporter(loopback_config(max_decode_cpu_s=3.0))
    try:
        holding = await _hold_the_thread(exporter)
        _reader, writer = await asyncio.open_connection("127.0.0.1", exporter.port)
        body = encode([SpanFactory().server(0.01) for _ in range(3)]).SerializeToString()
        writer.write(
            f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {otlp.PROTOBUF}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        state = exporter.app[STATE]
        try:
            await _in_line(exporter, 2)  # in line behind the hostile body
        finally:
            writer.close()  # the client gives up (a timeout, a restart)
        assert await holding == 413
        await _ingest_idle(exporter)
        assert state.metrics.spans_received == 0
        assert state.metrics.requests_rejected["abandoned"] == 1
    finally:
        await exporter.stop()
