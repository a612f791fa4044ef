"""``OtlpForwarder``: sends received export requests on to a trace backend, unchanged.

The receiver never waits for the backend: ``submit`` puts the raw body (still
gzipped if it came gzipped) on a bounded queue and returns at once; one task sends
them in order. A full queue, a failed send and what is left at shutdown are counted
as dropped, by reason. No retries: a backend that is down costs dropped traces,
never ingest latency or unbounded memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import aiohttp

from gpuscope.exporter.metrics import SelfMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Export:
    body: bytes
    content_type: str
    content_encoding: str | None
    spans: int


class OtlpForwarder:
    """Owns one ``aiohttp.ClientSession`` and one sender task between start and stop."""

    def __init__(
        self, url: str, *, queue_size: int, timeout_s: float, metrics: SelfMetrics
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._queue: asyncio.Queue[_Export] = asyncio.Queue(maxsize=queue_size)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        self._task = asyncio.create_task(self._send_loop(), name="gpuscope-otlp-forwarder")

    def submit(
        self, body: bytes, content_type: str, content_encoding: str | None, spans: int
    ) -> None:
        """Queue one export request of ``spans`` spans; dropped (counted) when full."""
        try:
            self._queue.put_nowait(_Export(body, content_type, content_encoding, spans))
        except asyncio.QueueFull:
            self.metrics.forward_spans_dropped["queue_full"] += spans

    async def stop(self, timeout_s: float) -> None:
        """Send what is queued for up to ``timeout_s``, then drop the rest (counted)."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout_s)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while not self._queue.empty():
            self.metrics.forward_spans_dropped["shutdown"] += self._queue.get_nowait().spans
        if self._session is not None:
            await self._session.close()

    async def _send_loop(self) -> None:
        assert self._session is not None
        while True:
            export = await self._queue.get()
            try:
                await self._send(self._session, export)
            finally:
                self._queue.task_done()

    async def _send(self, session: aiohttp.ClientSession, export: _Export) -> None:
        headers = {"Content-Type": export.content_type}
        if export.content_encoding:
            headers["Content-Encoding"] = export.content_encoding
        try:
            async with session.post(self.url, data=export.body, headers=headers) as response:
                await response.read()
                ok = response.status < 300
                if not ok:
                    log.warning("forwarding to %s: HTTP %d", self.url, response.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("forwarding to %s failed: %s", self.url, exc)
            ok = False
        except asyncio.CancelledError:  # stop() gave up on it mid-send
            self.metrics.forward_spans_dropped["shutdown"] += export.spans
            raise
        except Exception:  # anything else must not end the sender task for good
            log.exception("forwarding to %s failed unexpectedly", self.url)
            ok = False
        if ok:
            self.metrics.forward_spans_sent += export.spans
        else:
            self.metrics.forward_spans_dropped["send_failed"] += export.spans
