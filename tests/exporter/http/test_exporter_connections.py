"""Idle, slow and too many connections, over real sockets: timeouts close them, the cap
sheds idle ones first so that a scraper still gets /metrics, accept() failures are
logged once per interval."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuscope.exporter.http.connections import AcceptErrorLog
from gpuscope.exporter.service import RunningExporter, start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import loopback_config, samples, scrape, value
from support.servers import accept_queue_has_room
from support.waiting import await_until

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def start(**overrides: Any) -> RunningExporter:
    return await start_exporter(loopback_config(**overrides))


@pytest.fixture
async def short_timeouts() -> AsyncIterator[RunningExporter]:
    exporter = await start(header_timeout_s=0.5, idle_timeout_s=0.5)
    try:
        yield exporter
    finally:
        await exporter.stop()


async def closed_count(exporter: RunningExporter, reason: str) -> float | None:
    async with aiohttp.ClientSession() as session:
        scraped = samples(await scrape(session, exporter))
    return value(scraped, "gpuscope_http_connections_closed_total", {"reason": reason})


async def scrape_url(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200
        return await response.text()


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 30)


async def test_idle_connections_are_closed_after_the_idle_timeout(
    short_timeouts: RunningExporter,
) -> None:
    exporter = short_timeouts
    silent = await asyncio.open_connection(exporter.host, exporter.port)
    kept_alive = await asyncio.open_connection(exporter.host, exporter.port)
    kept_alive[1].write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await read_to_eof(silent[0]) == b""  # closed by the exporter, no request ever
    answered = await read_to_eof(kept_alive[0])  # the answer, then closed while idle
    assert answered.startswith(b"HTTP/1.1 200") and answered.endswith(b"ok\n")
    for _, writer in (silent, kept_alive):
        writer.close()
    assert await closed_count(exporter, "idle_timeout") == 2


async def test_headers_sent_one_byte_at_a_time_are_cut_off(
    short_timeouts: RunningExporter,
) -> None:
    exporter = short_timeouts
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    reader, writer = await asyncio.open_connection(exporter.host, exporter.port)
    sent = 0
    try:
        for byte in head:  # 0.1 s a byte: the whole head would take 24 s
            if reader.at_eof():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            sent += 1
            try:
                await asyncio.wait_for(reader.read(1), 0.1)
            except TimeoutError:
                continue
    except ConnectionError:
        pass  # closed under us: what should happen
    finally:
        writer.close()
    assert sent < len(head)
    assert await closed_count(exporter, "header_timeout") == 1


async def open_quiet_connections(exporter: RunningExporter, count: int) -> list[Connection]:
    """Half of them silent, half stuck in the middle of a request head."""
    connections = []
    for number in range(count):
        reader, writer = await asyncio.open_connection(exporter.host, exporter.port)
        if number % 2:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        connections.append((reader, writer))
    await asyncio.sleep(0)
    return connections


async def test_at_the_cap_a_scraper_still_gets_metrics() -> None:
    exporter = await start(max_connections=20, header_timeout_s=60, idle_timeout_s=60)
    connections = await open_quiet_connections(exporter, 20)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):  # the scraper's connection made room once, then is kept
                scraped = samples(await scrape(session, exporter))
        shed = value(scraped, "gpuscope_http_connections_closed_total", {"reason": "shed_at_cap"})
        assert shed == 1
        assert await read_to_eof(connections[0][0]) == b""  # the oldest went first
        assert value(scraped, "gpuscope_http_connections_max") == 20
    finally:
        for _, writer in connections:
            writer.close()
        await exporter.stop()


async def test_at_the_cap_with_every_connection_busy_and_none_uploading_a_new_one_gets_503() -> (
    None
):
    exporter = await start(max_connections=3, header_timeout_s=60, idle_timeout_s=60)
    state = exporter.app[STATE]
    scrapes = []
    try:
        async with state.render_lock:  # each scrape stays busy, waiting for the render
            for _ in range(3):
                reader, writer = await asyncio.open_connection(exporter.host, exporter.port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                scrapes.append((reader, writer))
            for _ in range(3000):  # the scrapes reach the handler in their own time
                if state.guard.busy == 3:
                    break
                await asyncio.sleep(0.01)
            reader, writer = await asyncio.open_connection(exporter.host, exporter.port)
            refused = await read_to_eof(reader)
            writer.close()
        assert refused.startswith(b"HTTP/1.1 503")
        for reader, _ in scrapes:  # served once the render is free again
            assert (await asyncio.wait_for(reader.readline(), 30)).startswith(b"HTTP/1.1 200")
    finally:
        for _, writer in scrapes:
            writer.close()
        await exporter.stop()


def test_accept_failures_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        context = {"message": AcceptErrorLog.MESSAGE, "exception": OSError(24, "Too many")}
        with caplog.at_level(logging.ERROR), AcceptErrorLog(loop, interval_s=3600) as handler:
            for _ in range(1000):
                loop.call_exception_handler(context)
            assert handler.suppressed == 999
        lines = [r for r in caplog.records if r.name == "gpuscope.exporter.http.connections"]
        assert len(lines) == 1 and "Too many" in lines[0].getMessage()
        assert loop.get_exception_handler() is None  # the previous handler is back
    finally:
        loop.close()


@dataclass
class LimitedExporter:
    process: asyncio.subprocess.Process
    url: str
    host: str
    port: int
    log: str  # up to "serving on"

    async def stop_and_read_log(self) -> str:
        """SIGTERM, exit status 0, and the whole log."""
        assert self.process.stderr is not None
        self.process.terminate()
        assert await asyncio.wait_for(self.process.wait(), 30) == 0
        return self.log + (await self.process.stderr.read()).decode()


@asynccontextmanager
async def exporter_with_fd_limit(limit: int, *flags: str) -> AsyncIterator[LimitedExporter]:
    """``gpuscope exporter`` in a process whose descriptors are limited to ``limit``;
    yields once it serves (the log up to then is checked by the caller)."""
    start_with_limit = (
        "import resource, runpy, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
        f"sys.argv = ['gpuscope', 'exporter', *{list(flags)!r}]; "
        "runpy.run_module('gpuscope', run_name='__main__')"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", start_with_limit, stderr=asyncio.subprocess.PIPE, cwd="/"
    )
    assert process.stderr is not None
    try:
        log = ""
        pattern = r"serving on (https?)://([\d.]+):(\d+)"
        while (found := re.search(pattern, log)) is None:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "exporter exited before serving:\n" + log
            log += line
        scheme, host, port = found.group(1), found.group(2), int(found.group(3))
        yield LimitedExporter(process, f"{scheme}://{host}:{port}", host, port, log)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_the_cap_is_fitted_under_the_file_descriptor_limit() -> None:
    """A real process with 128 descriptors and --max-connections 1000: 80 connections
    held open never exhaust them, and a scraper still gets /metrics."""
    flags = ("--listen", "127.0.0.1:0", "--gpu-source", "none", "--max-connections", "1000")
    held: list[Connection] = []
    async with exporter_with_fd_limit(128, *flags) as exporter:
        try:
            for _ in range(80):
                # each once the accept queue has room: a SYN dropped past a full one is
                # resent a second later (support.servers.accept_queue)
                await await_until(
                    lambda: accept_queue_has_room(exporter.port), "room in the accept queue"
                )
                held.append(await asyncio.open_connection(exporter.host, exporter.port))
            async with aiohttp.ClientSession() as session:
                text = await scrape_url(session, exporter.url + "/metrics")
            assert 'gpuscope_http_connections_closed_total{reason="shed_at_cap"}' in text
            # 128 - 64 of the exporter's own - 4 backlogs of 8 in transit
            assert "gpuscope_http_connections_max 32.0" in text
        finally:
            for _, writer in held:
                writer.close()
            log = await exporter.stop_and_read_log()
    assert "using 32" in log
    assert "Traceback" not in log and "accepting connections fails" not in log


async def burst_then_scrape(
    exporter: LimitedExporter, connections: int, trust: ssl.SSLContext | None = None
) -> list[int]:
    """Opens ``connections`` at once and holds them silent (for TLS: no handshake
    begun), then scrapes five times, each on a new connection; the scrapes' statuses."""
    held = await asyncio.gather(
        *(asyncio.open_connection(exporter.host, exporter.port) for _ in range(connections))
    )
    try:
        statuses = []
        for _ in range(5):
            connector = aiohttp.TCPConnector(force_close=True)
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.get(exporter.url + "/metrics", ssl=trust or True) as answer,
            ):
                await answer.read()
                statuses.append(answer.status)
        return statuses
    finally:
        for _, writer in held:
            writer.close()


async def test_a_burst_of_connections_never_runs_out_of_descriptors() -> None:
    """400 connections opened at once against 256 descriptors. Before, 64 descriptors
    were kept free while asyncio accepts the whole backlog (128) in one go, several
    times before the first can be shed, so bursts made ``accept()`` fail (465 failures
    in 11 s)."""
    flags = ("--listen", "127.0.0.1:0", "--gpu-source", "none", "--max-connections", "1000")
    async with exporter_with_fd_limit(256, *flags, "--idle-timeout-s", "60") as exporter:
        assert await burst_then_scrape(exporter, 400) == [200] * 5
        log = await exporter.stop_and_read_log()
    assert "accepting connections fails" not in log and "Traceback" not in log


async def test_tls_connections_count_against_the_cap_from_their_accept(
    tmp_path: Path, self_signed: tuple[Path, Path]
) -> None:
    """400 TLS clients that never finish (never begin) their handshake, against 256
    descriptors. Before, a TLS connection counted only once its handshake was done:
    these exhausted the descriptors and 3 of 5 scrapes failed."""
    cert, key = self_signed
    web_config = tmp_path / "web.yml"
    web_config.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    flags = (
        "--listen", "127.0.0.1:0", "--gpu-source", "none", "--max-connections", "1000",
        "--web-config-file", str(web_config), "--header-timeout-s", "60",
    )  # fmt: skip
    async with exporter_with_fd_limit(256, *flags) as exporter:
        assert exporter.url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(cert))
        assert await burst_then_scrape(exporter, 400, trust) == [200] * 5
        log = await exporter.stop_and_read_log()
    assert "accepting connections fails" not in log and "Traceback" not in log
