"""``OtlpForwarder``: sends received export requests on to a trace backend, unchanged.

The receiver never waits for the backend: ``submit`` puts the raw body (still
gzipped if it came gzipped) on a queue bounded both in requests (``--forward-queue``)
and in bytes (``--forward-queue-bytes``, the request being sent included) and returns
at once; one task sends them in order. A full queue, a failed send and what is left at
shutdown are counted as dropped, by reason. No retries: a backend that is down costs
dropped traces, never ingest latency or unbounded memory. Of the backend's answer only
the status and at most ``RESPONSE_READ_BYTES`` of body are read; a longer body (a
broken or hostile backend may send one without end) is dropped with its connection.

The log says when the backend goes down and when it is back, and while it stays
down a summary every ``summary_interval_s``; the counters hold the exact figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp

log = logging.getLogger(__name__)

FORWARD_DROP_REASONS = ("queue_full", "send_failed", "shutdown")


class ForwardCounters(Protocol):
    """Where the forwarder counts what it sent and dropped (the exporter's self metrics,
    which a scrape reads); a protocol, so forwarding does not depend on the scrape side."""

    forward_spans_sent: int
    forward_spans_dropped: Counter[str]


SUMMARY_INTERVAL_S = 60.0
# An ExportTraceServiceResponse is a few bytes (a partial_success message at most), so
# a backend's answer is read up to this much and the rest left unread: the connection
# is then closed instead of reused. Before, a backend answering an endless body took
# the exporter to 3.1 GiB in one forward.
RESPONSE_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class _Export:
    body: bytes
    content_type: str
    content_encoding: str | None
    spans: int


class BackendHealth:
    """Turns a stream of send outcomes into log lines: one per state change, and while
    the backend is down one summary per ``interval_s``."""

    def __init__(
        self, url: str, interval_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self._clock = clock
        self.down = False
        self._failures = 0  # since the last line
        self._spans = 0
        self._since = 0.0

    def failed(self, spans: int, error: str) -> None:
        self._failures += 1
        self._spans += spans
        now = self._clock()
        if not self.down:
            self.down, self._since = True, now
            log.warning(
                "forwarding to %s failed, backend treated as down: %s "
                "(further failures are summarised every %.0f s)",
                self.url, error, self.interval_s,
            )  # fmt: skip
            self._failures = self._spans = 0
        elif now - self._since >= self.interval_s:
            log.warning(
                "forwarding to %s still failing: %d sends and %d spans dropped in the last "
                "%.0f s; last error: %s",
                self.url, self._failures, self._spans, now - self._since, error,
            )  # fmt: skip
            self._since, self._failures, self._spans = now, 0, 0

    def succeeded(self) -> None:
        if self.down:
            log.warning(
                "forwarding to %s works again (%d more sends and %d spans dropped before)",
                self.url, self._failures, self._spans,
            )  # fmt: skip
            self.down, self._failures, self._spans = False, 0, 0


class OtlpForwarder:
    """Owns one ``aiohttp.ClientSession`` and one sender task between start and stop."""

    def __init__(
        self,
        url: str,
        *,
        queue_size: int,
        queue_bytes: int,
        timeout_s: float,
        metrics: ForwardCounters,
        summary_interval_s: float = SUMMARY_INTERVAL_S,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.health = BackendHealth(url, summary_interval_s)
        self._queue: asyncio.Queue[_Export] = asyncio.Queue(maxsize=queue_size)
        self.queue_bytes = queue_bytes
        self._bytes = 0  # bodies queued or being sent
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        self._task = asyncio.create_task(self._send_loop(), name="gpuscope-otlp-forwarder")

    def submit(
        self, body: bytes, content_type: str, content_encoding: str | None, spans: int
    ) -> None:
        """Queue one export request of ``spans`` spans; dropped (counted) when the queue
        is full in requests or in bytes. A body larger than the byte bound on its own
        still goes when nothing else is waiting, so no size is never forwarded."""
        if self._bytes and self._bytes + len(body) > self.queue_bytes:
            self.metrics.forward_spans_dropped["queue_full"] += spans
            return
        try:
            self._queue.put_nowait(_Export(body, content_type, content_encoding, spans))
        except asyncio.QueueFull:
            self.metrics.forward_spans_dropped["queue_full"] += spans
            return
        self._bytes += len(body)

    async def stop(self, timeout_s: float) -> None:
        """Send what is queued for up to ``timeout_s``, then drop the rest (counted)."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while not self._queue.empty():
            export = self._queue.get_nowait()
            self._bytes -= len(export.body)
            self.metrics.forward_spans_dropped["shutdown"] += export.spans
        if self._session is not None:
            await self._session.close()

    async def _send_loop(self) -> None:
        assert self._session is not None
        while True:
            export = await self._queue.get()
            try:
                await self._send(self._session, export)
            finally:
                self._bytes -= len(export.body)
                self._queue.task_done()

    async def _send(self, session: aiohttp.ClientSession, export: _Export) -> None:
        headers = {"Content-Type": export.content_type}
        if export.content_encoding:
            headers["Content-Encoding"] = export.content_encoding
        error = ""
        try:
            async with session.post(self.url, data=export.body, headers=headers) as response:
                await _read_some(response.content, RESPONSE_READ_BYTES)
                if not response.content.at_eof():
                    response.close()  # the rest is never read: the connection goes
                if response.status >= 300:
                    error = f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = str(exc) or type(exc).__name__
        except asyncio.CancelledError:  # stop() gave up on it mid-send
            self.metrics.forward_spans_dropped["shutdown"] += export.spans
            raise
        except Exception as exc:  # anything else must not end the sender task for good
            log.exception("forwarding to %s failed unexpectedly", self.url)
            error = repr(exc)
        if error:
            self.metrics.forward_spans_dropped["send_failed"] += export.spans
            self.health.failed(export.spans, error)
        else:
            self.metrics.forward_spans_sent += export.spans
            self.health.succeeded()


async def _read_some(content: aiohttp.StreamReader, limit: int) -> None:
    """Read and drop at most ``limit`` bytes (a little more if one piece overshoots)."""
    read = 0
    while read < limit and not content.at_eof():
        read += len(await content.readany())
