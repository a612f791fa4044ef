"""Clients that ask for /metrics and never read the answer, over real sockets: they are
closed after --write-timeout-s, shed at the cap like idle ones so that a scraper still
gets /metrics, and each holds a bounded piece of the scrape, not all of it."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gpuscope import spans as contract
from gpuscope.exporter.http.render import STREAM_PIECE_BYTES
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import SpanFactory, encode, loopback_config, samples, value

HIGH_WATER = 64 * 1024  # asyncio's default for a socket transport


@functools.cache
def many_models() -> bytes:
    spans = SpanFactory()
    request = encode(
        spans.server(0.01, phases={"queue": 0.001}, attrs={contract.GEN_AI_REQUEST_MODEL: f"m{n}"})
        for n in range(1500)
    )
    body: bytes = request.SerializeToString()
    return body


async def start_with_series(**overrides: Any) -> RunningExporter:
    """An exporter whose scrape (about 6 MB) is far larger than what the socket buffers
    of a client that does not read can take."""
    # 1,500 models of one service: past the default per-service cap, which would fold them
    exporter = await start_exporter(loopback_config(max_models_per_service=2000, **overrides))
    request = ExportTraceServiceRequest.FromString(many_models())
    assert exporter.app[STATE].aggregator.ingest(request).aggregated == 1500
    return exporter


async def never_reading(exporter: RunningExporter) -> socket.socket:
    """A client that asks for /metrics and reads nothing, with a small receive buffer."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, (exporter.host, exporter.port))
    client.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return client


async def wait_for_stalled(exporter: RunningExporter, count: int) -> None:
    guard = exporter.app[STATE].guard
    for _ in range(3000):
        if guard.stalled == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{guard.stalled} of {count} clients stalled")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def scrape_status(session: aiohttp.ClientSession, exporter: RunningExporter) -> str:
    async with session.get(exporter.url + "/metrics") as response:
        assert response.status == 200
        return await response.text()


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_at_the_cap_clients_that_never_read_are_shed_and_a_scrape_succeeds(
    session: aiohttp.ClientSession,
) -> None:
    """Before, 20 such clients at --max-connections 20 made every scrape 503 until they
    left: they were busy, and only idle connections and uploads could be shed."""
    exporter = await start_with_series(max_connections=20, write_timeout_s=60)
    clients = [await never_reading(exporter) for _ in range(20)]
    try:
        await wait_for_stalled(exporter, 20)
        clients += [await never_reading(exporter) for _ in range(5)]  # each sheds one
        await wait_for_stalled(exporter, 20)
        for _ in range(3):  # the first makes room, the next reuse its connection
            scraped = samples(await scrape_status(session, exporter))
        closed = "gpuscope_http_connections_closed_total"
        assert value(scraped, closed, {"reason": "shed_at_cap"}) == 6
        assert value(scraped, "gpuscope_request_duration_seconds_count", {"model": "m7"}) == 1
        # What a stalled client holds: one piece of the scrape at most, beyond what the
        # kernel buffers; the scrape itself is 6 MB.
        guard = exporter.app[STATE].guard
        held = [c.transport.get_write_buffer_size() for c in guard._open.values() if c.transport]
        assert max(held) <= STREAM_PIECE_BYTES + HIGH_WATER
    finally:
        for client in clients:
            client.close()
        await exporter.stop()


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_a_client_that_never_reads_is_closed_after_the_write_timeout(
    session: aiohttp.ClientSession,
) -> None:
    exporter = await start_with_series(write_timeout_s=0.5, idle_timeout_s=60)
    client = await never_reading(exporter)
    try:
        await wait_for_stalled(exporter, 1)
        guard = exporter.app[STATE].guard
        for _ in range(3000):  # closed, and the scrape's handler ended too
            if len(guard) == 0 and guard.busy == 0:
                break
            await asyncio.sleep(0.01)
        assert len(guard) == 0 and guard.busy == 0
        assert guard.closed_by_reason["write_timeout"] == 1
        scraped = samples(await scrape_status(session, exporter))
        closed = "gpuscope_http_connections_closed_total"
        assert value(scraped, closed, {"reason": "write_timeout"}) == 1
    finally:
        client.close()
        await exporter.stop()
