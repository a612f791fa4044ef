"""``Ingest``: export requests decompressed, decoded and aggregated in a thread of their
own, one request at a time.

On the event loop, one small request could hold everything else up: decoding and
aggregating a million empty spans kept ``/healthz`` waiting 10-37 s. Here the loop
only waits for a future, so health checks and scrapes are answered meanwhile (what is
left of a stall is the longest single C call of the decoder, which holds Python's
lock: ``docs/reliability.md`` has the figures). The spans are counted before the
expensive steps (``otlp_counts``), so a request past ``--max-spans-per-request`` or
``--max-attributes-per-request`` is refused (413) having cost almost nothing.

One thread, so one request is decoded at a time: the decoder's memory (a small multiple
of the decompressed size, see ``docs/reliability.md``) is paid once, not once per
connection, and the aggregator keeps a single writer. The series' sequence locks make
that writer safe against the render threads, as they did when it was the event loop.
Requests wait their turn in order; each one waiting is a connection counted against
``--max-connections``, which bounds the line.

A request's outcome is all or nothing. Decoding may be abandoned: when the shutdown
timeout runs out first, the handler answers 503 (the sender retries it) and the thread
drops the request when it is done decoding. Aggregation may not: once it has begun
(``_Job.commit``) the handler waits for it, so a request that was answered 503 was never
counted, and one that was counted is answered 200. Aggregating is bounded by the caps
(about 0.3 s for 100,000 spans); decoding is what can take long.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from asyncio import FIRST_COMPLETED
from functools import partial
from typing import Any

from gpuscope.exporter.http.threads import ThreadPool
from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.aggregator import IngestResult, SpanAggregator
from gpuscope.exporter.ingest.otlp_counts import (
    check_json_counts,
    check_parsed_attributes,
    check_protobuf_spans,
)


def decode_within_limits(data: bytes, media: str, limits: otlp.Limits) -> Any:
    """``otlp.decode_request`` with the span, attribute and JSON value caps checked
    before each expensive step."""
    if media == otlp.PROTOBUF:
        check_protobuf_spans(data, limits.max_spans)
        request = otlp.decode_protobuf(data)
        check_parsed_attributes(request, len(data), limits.max_attributes)
        return request
    document = otlp.load_json(data, limits.max_json_values)
    check_json_counts(document, limits.max_spans, limits.max_attributes)
    return otlp.json_to_request(document)


class _Job:
    """Whether one request may still be given up (decoding) or must be seen through
    (aggregating); decided under a lock between the handler and the ingest thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._committed = self._cancelled = False

    def commit(self) -> bool:
        """Called by the ingest thread before aggregating; False if given up."""
        with self._lock:
            self._committed = not self._cancelled
            return self._committed

    def cancel(self) -> bool:
        """Called by the handler; False if aggregation has begun (wait for it)."""
        with self._lock:
            self._cancelled = not self._committed
            return self._cancelled


class _GivenUp(Exception):
    """The handler answered before this request was aggregated; it was dropped."""


class Ingest:
    """Owns the ingest thread; ``run`` is called from the event loop."""

    def __init__(self, aggregator: SpanAggregator, limits: otlp.Limits) -> None:
        self.aggregator = aggregator
        self.limits = limits
        # The line is bounded by the connection cap, not here (see the module's doc).
        self._thread = ThreadPool("gpuscope-ingest", 1, sys.maxsize)

    async def run(
        self,
        body: bytes,
        content_encoding: str | None,
        media: str,
        give_up: asyncio.Event,
        authenticated: bool = False,
    ) -> IngestResult:
        """Decompress, decode and aggregate ``body``; an ``OtlpError`` if it is refused,
        or 503 ``shutting_down`` when ``give_up`` is set before it is being aggregated.
        ``authenticated``: the sender passed authentication (for the process join)."""
        job = _Job()
        work = self._thread.submit(
            partial(self._ingest, job, body, content_encoding, media, authenticated)
        )
        stop = asyncio.ensure_future(give_up.wait())
        try:
            await asyncio.wait((work, stop), return_when=FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server's last resort at shutdown
            if job.cancel():
                work.cancel()
            raise
        finally:
            stop.cancel()
        if not work.done() and job.cancel():
            work.cancel()
            raise otlp.OtlpError(
                503, otlp.SHUTTING_DOWN, "the exporter is shutting down; send this request again"
            )
        return await work  # done, or being aggregated: finishes soon

    def _ingest(
        self,
        job: _Job,
        body: bytes,
        content_encoding: str | None,
        media: str,
        authenticated: bool = False,
    ) -> IngestResult:
        """In the ingest thread."""
        data = otlp.decompress(body, content_encoding, self.limits)
        request = decode_within_limits(data, media, self.limits)
        del data
        if not job.commit():
            raise _GivenUp
        return self.aggregator.ingest(request, authenticated)

    @property
    def pending(self) -> int:
        """Requests being decoded or aggregated, or waiting for their turn."""
        return self._thread.pending

    def close(self) -> None:
        self._thread.close()
