"""Slow uploads over real sockets: a body not in within --body-timeout-s gets 408 and
its connection is closed; at the cap with every connection uploading, the oldest upload
is cut (503) so that a scraper still gets /metrics. Every such answer is counted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest
from google.rpc import code_pb2  # type: ignore[import-untyped]
from google.rpc.status_pb2 import Status  # type: ignore[import-untyped]

from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import loopback_config, samples, scrape, value

HEAD = (
    b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
    b"Content-Length: 1000\r\n\r\n"
)
WAIT_S = 30.0  # generous bound for anything the exporter should do at once


class SlowUploader:
    """A client that sends a valid head, then its body one byte per ``interval_s``
    (never all of it) until the exporter answers and closes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.answer = asyncio.ensure_future(asyncio.wait_for(self._read_answer(), 60))
        self.sent = 0
        self.trickling: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(
        cls, exporter: RunningExporter, interval_s: float, head: bytes = HEAD
    ) -> SlowUploader:
        uploader = cls(*await asyncio.open_connection(exporter.host, exporter.port))
        uploader.writer.write(head)
        uploader.trickling = asyncio.ensure_future(uploader._trickle(interval_s))
        return uploader

    async def _trickle(self, interval_s: float) -> None:
        for _ in range(999):  # bounded: the body is 1,000 bytes
            if self.answer.done():
                return
            try:
                self.writer.write(b"x")
                await self.writer.drain()
            except ConnectionError:
                return  # closed under us: what should happen
            self.sent += 1
            await asyncio.wait({self.answer}, timeout=interval_s)

    async def _read_answer(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode().lower().split("\r\n")
        length = next(
            int(line.split(":")[1]) for line in lines if line.startswith("content-length:")
        )
        return int(lines[0].split()[1]), await self.reader.readexactly(length)

    async def answered(self) -> tuple[int, bytes]:
        """Status and body of the answer, once the exporter has closed the connection."""
        answer = await self.answer
        await self.trickling
        try:
            rest = await asyncio.wait_for(self.reader.read(), WAIT_S)
        except ConnectionResetError:
            rest = b""  # closed while the last trickled byte was on its way
        assert rest == b""
        return answer

    def close(self) -> None:
        self.answer.cancel()
        self.trickling.cancel()
        self.writer.close()


async def start(**overrides: Any) -> RunningExporter:
    return await start_exporter(loopback_config(**overrides))


async def scraped_samples(exporter: RunningExporter) -> Sequence[Any]:
    async with aiohttp.ClientSession() as session:
        return samples(await scrape(session, exporter))


async def wait_for_uploads(exporter: RunningExporter, count: int) -> None:
    """Until ``count`` connections are in the handler, reading their bodies."""
    guard = exporter.app[STATE].guard
    for _ in range(int(WAIT_S / 0.01)):
        if guard.busy == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{guard.busy} of {count} uploads reached the handler")


def rejected(scraped: Sequence[Any], reason: str) -> float | None:
    return value(scraped, "gpuscope_otlp_requests_rejected_total", {"reason": reason})


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_a_body_sent_one_byte_at_a_time_gets_408_and_the_connection_closes() -> None:
    exporter = await start(body_timeout_s=0.5)
    uploader = await SlowUploader.open(exporter, interval_s=0.1)  # 1,000 bytes: 100 s
    try:
        status, body = await uploader.answered()
        assert status == 408
        assert Status.FromString(body).code == code_pb2.DEADLINE_EXCEEDED
        assert uploader.sent < 999
        scraped = await scraped_samples(exporter)
        assert rejected(scraped, "body_timeout") == 1
    finally:
        uploader.close()
        await exporter.stop()


async def test_reject_reasons_of_slow_bodies_exist_at_zero_from_the_start() -> None:
    exporter = await start()
    try:
        scraped = await scraped_samples(exporter)
    finally:
        await exporter.stop()
    assert rejected(scraped, "body_timeout") == 0
    assert rejected(scraped, "shed_at_cap") == 0


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_at_the_cap_slow_uploaders_are_cut_so_a_scraper_gets_metrics() -> None:
    """Three uploads at one byte a second hold all three slots; a scrape cuts the oldest
    (503, at once, long before their 60 s body timeout) and is served."""
    exporter = await start(max_connections=3, body_timeout_s=60, idle_timeout_s=60)
    uploaders: list[SlowUploader] = []
    try:
        for _ in range(3):
            uploaders.append(await SlowUploader.open(exporter, interval_s=1.0))
            await wait_for_uploads(exporter, len(uploaders))  # so that the age order is known
        scraped = await asyncio.wait_for(scraped_samples(exporter), WAIT_S)
        status, body = await asyncio.wait_for(uploaders[0].answered(), WAIT_S)
        assert status == 503
        assert Status.FromString(body).code == code_pb2.UNAVAILABLE
        assert not uploaders[1].answer.done() and not uploaders[2].answer.done()
        assert rejected(scraped, "shed_at_cap") == 1
        closed = value(scraped, "gpuscope_http_connections_closed_total", {"reason": "shed_at_cap"})
        assert closed == 1
    finally:
        for uploader in uploaders:
            uploader.close()
        await exporter.stop()


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_at_the_cap_every_slow_uploader_is_answered_and_counted() -> None:
    """--max-connections 3, three uploads trickling, --body-timeout-s 1: the scrape gets
    /metrics within the body timeout, the cut upload gets 503, the other two 408."""
    exporter = await start(max_connections=3, body_timeout_s=1.0, idle_timeout_s=60)
    uploaders: list[SlowUploader] = []
    try:
        for _ in range(3):
            uploaders.append(await SlowUploader.open(exporter, interval_s=0.2))
        await wait_for_uploads(exporter, 3)
        await asyncio.wait_for(scraped_samples(exporter), 1.0 + WAIT_S)
        statuses = [status for status, _ in [await u.answered() for u in uploaders]]
        assert sorted(statuses) == [408, 408, 503]
        scraped = await scraped_samples(exporter)
        assert rejected(scraped, "shed_at_cap") == 1
        assert rejected(scraped, "body_timeout") == 2
        assert exporter.app[STATE].guard.busy == 0
    finally:
        for uploader in uploaders:
            uploader.close()
        await exporter.stop()


@pytest.mark.slow  # waits out timeouts it tests: left out of the fast tier
async def test_a_slow_body_on_a_route_that_does_not_read_it_is_dropped_after_the_answer() -> None:
    """No handler reads it, so it is no upload: answered at once, then the rest is read
    and dropped for a moment and the connection closed (not held until the idle timeout)."""
    exporter = await start(body_timeout_s=60, idle_timeout_s=60, header_timeout_s=60)
    head = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    uploader = await SlowUploader.open(exporter, interval_s=0.1, head=head)
    try:
        status, _ = await uploader.answered()
        assert status == 405
        assert uploader.sent < 999
        assert len(exporter.app[STATE].guard) == 0
    finally:
        uploader.close()
        await exporter.stop()
