"""--forward-otlp: export requests reach a real backend byte for byte; drops are counted."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from gpuscope.exporter.ingest.forward import BackendHealth
from gpuscope.exporter.service import start_exporter
from gpuscope.exporter.state import STATE
from support.exporter_fixtures import SpanFactory, encode, loopback_config, post_spans


@dataclass
class Backend:
    """A trace backend stand-in: a real aiohttp server that keeps what it receives."""

    url: str = ""
    received: list[tuple[bytes, str, str | None]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append(
            (await request.read(), request.content_type, request.headers.get("Content-Encoding"))
        )
        self.arrived.set()
        await self.release.wait()
        return web.Response(body=b"", content_type="application/x-protobuf")


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    state = Backend()
    app = web.Application()
    app.router.add_post("/v1/traces", state.handle)
    runner = web.AppRunner(app, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    state.url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


async def test_forwarded_unchanged_and_counted(backend: Backend) -> None:
    backend.release.set()
    exporter = await start_exporter(loopback_config(forward_otlp=backend.url))
    body = gzip.compress(encode([SpanFactory().server(0.01) for _ in range(3)]).SerializeToString())
    async with aiohttp.ClientSession() as session:
        status, _ = await post_spans(session, exporter, body, headers={"Content-Encoding": "gzip"})
    assert status == 200
    await exporter.stop()  # drains the forward queue
    assert backend.received == [(body, "application/x-protobuf", "gzip")]
    metrics = exporter.app[STATE].metrics
    assert metrics.forward_spans_sent == 3
    assert sum(metrics.forward_spans_dropped.values()) == 0


async def test_full_queue_drops_and_counts_without_slowing_ingest(backend: Backend) -> None:
    exporter = await start_exporter(loopback_config(forward_otlp=backend.url, forward_queue=1))
    body = encode([SpanFactory().server(0.01) for _ in range(2)]).SerializeToString()
    async with aiohttp.ClientSession() as session:
        assert (await post_spans(session, exporter, body))[0] == 200
        await backend.arrived.wait()  # the sender is now stuck on the slow backend
        for _ in range(3):  # one fits the queue, two are dropped; all answer at once
            assert (await post_spans(session, exporter, body))[0] == 200
    metrics = exporter.app[STATE].metrics
    assert metrics.forward_spans_dropped["queue_full"] == 4
    backend.release.set()
    await exporter.stop()
    assert metrics.forward_spans_sent == 4
    assert len(backend.received) == 2


async def test_unreachable_backend_counts_failed_sends() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{closed_port}/v1/traces"
    exporter = await start_exporter(loopback_config(forward_otlp=url))
    body = encode([SpanFactory().server(0.01)]).SerializeToString()
    async with aiohttp.ClientSession() as session:
        assert (await post_spans(session, exporter, body))[0] == 200
    await exporter.stop()
    assert exporter.app[STATE].metrics.forward_spans_dropped["send_failed"] == 1


async def test_an_export_in_flight_at_shutdown_is_counted_as_dropped(backend: Backend) -> None:
    exporter = await start_exporter(
        loopback_config(forward_otlp=backend.url, forward_timeout_s=30.0, shutdown_timeout_s=0.2)
    )
    body = encode([SpanFactory().server(0.01) for _ in range(3)]).SerializeToString()
    async with aiohttp.ClientSession() as session:
        assert (await post_spans(session, exporter, body))[0] == 200
        await backend.arrived.wait()  # being sent; the backend never answers
        assert (await post_spans(session, exporter, body))[0] == 200  # queued behind it
    await exporter.stop()  # gives up on the backend after shutdown_timeout
    metrics = exporter.app[STATE].metrics
    assert metrics.forward_spans_sent == 0
    # every accepted span is accounted for: 3 queued and 3 cut off mid-send
    assert metrics.forward_spans_dropped["shutdown"] == 6


async def test_an_unexpected_send_error_does_not_stop_forwarding(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.release.set()
    exporter = await start_exporter(loopback_config(forward_otlp=backend.url))
    real_post = aiohttp.ClientSession.post
    calls = 0

    def post_failing_once(
        session: aiohttp.ClientSession, url: str, *args: object, **kwargs: object
    ) -> object:
        nonlocal calls
        if url == backend.url:  # the forwarder's sends, not this test's own client
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug in a dependency")
        return real_post(session, url, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(aiohttp.ClientSession, "post", post_failing_once)
    body = encode([SpanFactory().server(0.01)]).SerializeToString()
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            assert (await post_spans(session, exporter, body))[0] == 200
    await exporter.stop()  # drains the queue: the second export must have been sent
    metrics = exporter.app[STATE].metrics
    assert metrics.forward_spans_dropped["send_failed"] == 1
    assert metrics.forward_spans_sent == 1
    assert len(backend.received) == 1


def _forward_log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpuscope.exporter.ingest.forward"]


async def test_a_down_backend_logs_state_changes_not_every_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = {"status": 503}

    async def flaky(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=answers["status"])

    app = web.Application()
    app.router.add_post("/v1/traces", flaky)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    exporter = await start_exporter(loopback_config(forward_otlp=url, forward_queue=512))
    body = encode([SpanFactory().server(0.01)]).SerializeToString()
    forwarder = exporter.app[STATE].forwarder
    assert forwarder is not None
    caplog.set_level("INFO", logger="gpuscope.exporter.ingest.forward")
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                assert (await post_spans(session, exporter, body))[0] == 200
            await forwarder._queue.join()
            down = _forward_log_lines(caplog)
            answers["status"] = 200
            assert (await post_spans(session, exporter, body))[0] == 200
            await forwarder._queue.join()
    finally:
        await exporter.stop()
        await runner.cleanup()
    metrics = exporter.app[STATE].metrics
    assert metrics.forward_spans_dropped["send_failed"] == 200  # the counters are exact
    assert metrics.forward_spans_sent == 1
    assert len(down) == 1 and "HTTP 503" in down[0] and "treated as down" in down[0]
    back = _forward_log_lines(caplog)[1:]
    assert len(back) == 1 and "works again (199 more sends" in back[0]


def test_while_down_one_summary_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    health = BackendHealth("http://backend", 60.0, clock=lambda: now[0])
    caplog.set_level("INFO", logger="gpuscope.exporter.ingest.forward")
    for _ in range(1000):  # 1,000 failures over 125 s: down, then summaries at 60 and 120 s
        health.failed(2, "connection refused")
        now[0] += 0.125
    lines = _forward_log_lines(caplog)
    assert len(lines) == 3
    assert "still failing: 480 sends and 960 spans dropped in the last 60 s" in lines[1]


@dataclass
class EndlessBackend:
    """Answers 200 with a body that never ends (64 KiB every 10 ms, about 6 MiB/s, so
    that a forwarder reading it all is stopped by its timeout long before memory runs
    out); counts what it managed to write."""

    url: str = ""
    written: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse()
        response.content_type = "application/x-protobuf"
        await response.prepare(request)
        try:
            while True:
                await response.write(b"\0" * 65536)
                self.written += 65536
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            self.done.set()
            raise


async def test_an_endless_backend_answer_is_read_a_little_then_dropped() -> None:
    """Before, the forwarder read the whole answer: here until --forward-timeout-s ran
    out and the send counted as failed (3.1 GiB of memory when the backend is fast)."""
    backend = EndlessBackend()
    app = web.Application()
    app.router.add_post("/v1/traces", backend.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    backend.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    exporter = await start_exporter(
        loopback_config(forward_otlp=backend.url, forward_timeout_s=5.0, shutdown_timeout_s=10.0)
    )
    try:
        body = encode([SpanFactory().server(0.01) for _ in range(2)]).SerializeToString()
        async with aiohttp.ClientSession() as session:
            assert (await post_spans(session, exporter, body))[0] == 200
        await asyncio.wait_for(backend.done.wait(), 30)  # the forwarder hung up
    finally:
        await exporter.stop()
        await runner.cleanup()
    metrics = exporter.app[STATE].metrics
    assert metrics.forward_spans_sent == 2  # a 200 is a success, whatever follows it
    assert metrics.forward_spans_dropped["send_failed"] == 0
    assert backend.written < 16 << 20  # what the socket buffers took, not the stream


async def test_the_forward_queue_is_bounded_in_bytes_the_send_in_flight_included(
    backend: Backend,
) -> None:
    body = encode([SpanFactory().server(0.01) for _ in range(2)]).SerializeToString()
    exporter = await start_exporter(
        loopback_config(forward_otlp=backend.url, forward_queue_bytes=3 * len(body))
    )
    async with aiohttp.ClientSession() as session:
        assert (await post_spans(session, exporter, body))[0] == 200
        await backend.arrived.wait()  # being sent, and the backend does not answer
        for _ in range(9):  # two more fit in the bytes left, seven do not
            assert (await post_spans(session, exporter, body))[0] == 200
    metrics = exporter.app[STATE].metrics
    assert metrics.forward_spans_dropped["queue_full"] == 7 * 2
    backend.release.set()
    await exporter.stop()
    assert metrics.forward_spans_sent == 3 * 2


async def test_a_body_larger_than_the_byte_bound_still_goes_when_nothing_waits(
    backend: Backend,
) -> None:
    backend.release.set()
    body = encode([SpanFactory().server(0.01) for _ in range(3)]).SerializeToString()
    exporter = await start_exporter(
        loopback_config(forward_otlp=backend.url, forward_queue_bytes=len(body) // 2)
    )
    async with aiohttp.ClientSession() as session:
        assert (await post_spans(session, exporter, body))[0] == 200
    await exporter.stop()
    assert exporter.app[STATE].metrics.forward_spans_sent == 3
