"""``Ingest``: export requests decompressed, decoded and aggregated in a thread of their
own, senders served in turn, each request counted only if its sender is told so.

On the event loop, one small request could hold everything else up: decoding and
aggregating a million empty spans kept ``/healthz`` waiting 10-37 s. Here the loop
only waits for futures, so health checks and scrapes are answered meanwhile. The spans
are counted before the expensive steps (``otlp_counts``), so a request past
``--max-spans-per-request`` or ``--max-attributes-per-request`` is refused (413) having
cost almost nothing.

One thread, so one request is decoded at a time: the decoder's memory (a small multiple
of the decompressed size, see ``docs/reliability.md``) is paid once, and the aggregator
keeps a single writer (the series' sequence locks make it safe against the render
threads). What waits for the thread is bounded in bytes (``memory``), and served fairly:
each sender (the peer's address) has its own line and the thread takes one request from
each sender in turn, so four connections of one hostile sender hold another sender's
request up for at most one of their decodes, which ``--max-decode-cpu-s`` bounds
(``decode_budget``).

A request's outcome is all or nothing, and counted only when its sender hears so:
decoding yields a pending request that the thread holds while the handler decides.
The handler commits it (the thread aggregates it, and the handler answers 200) only if
the client is still connected and ``--ingest-timeout-s`` has not passed since its body
was in; else the thread drops it and it is counted ``abandoned`` (answered 503 with
``Retry-After``, which the OpenTelemetry SDK retries: a retried request is counted
once). The shutdown timeout gives a request up the same way (503 ``shutting_down``).
Once aggregation has begun the handler waits for it (bounded by the caps: about 0.3 s
for 100,000 spans), so a request answered 503 was never counted, and one that was
counted is answered 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from asyncio import FIRST_COMPLETED
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final

from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.aggregator import IngestResult, SpanAggregator
from gpuscope.exporter.ingest.decode_budget import (
    DECODE_BUDGET,
    GivenUp,
    cpu_budget,
    needs_watching,
)
from gpuscope.exporter.ingest.memory import INGEST_MEMORY_FULL, IngestMemory
from gpuscope.exporter.ingest.otlp_counts import (
    check_json_counts,
    check_parsed_attributes,
    check_protobuf_spans,
)

# ``gpuscope_otlp_requests_rejected_total{reason}``: given up before it was counted.
ABANDONED: Final = "abandoned"
INGEST_REJECT_REASONS: Final = (INGEST_MEMORY_FULL, DECODE_BUDGET, ABANDONED)

# How long the thread keeps a decoded request for its handler's decision; the handler
# decides as soon as the loop runs, so this only matters if the loop has stopped.
_DECISION_WAIT_S: Final = 30.0


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
    """One request between its handler (on the loop) and the ingest thread: waiting,
    decoding, decoded (the thread holds it for the handler's decision), then committed
    (aggregated) or given up; the decision is taken under a lock."""

    def __init__(
        self, body: bytes, content_encoding: str | None, media: str, authenticated: bool
    ) -> None:
        self.body, self.content_encoding, self.media = body, content_encoding, media
        self.authenticated = authenticated  # the sender passed auth (for the process join)
        self.loop = asyncio.get_running_loop()
        self.decoded: asyncio.Future[None] = self.loop.create_future()
        self.aggregated: asyncio.Future[IngestResult] = self.loop.create_future()
        self._lock = threading.Lock()
        self._decided = threading.Event()
        self._committed = self.given_up = False

    def give_up(self) -> bool:
        """By the handler; False if aggregation has begun (wait for it)."""
        with self._lock:
            if not self._committed:
                self.given_up = True
                self._decided.set()
            return self.given_up

    def commit(self) -> bool:
        """By the handler, once the request is decoded; False if the thread dropped it."""
        with self._lock:
            self._committed = not self.given_up
            self._decided.set()
            return self._committed

    def wait_for_decision(self) -> bool:
        """In the thread: True to aggregate, False to drop."""
        self._decided.wait(_DECISION_WAIT_S)
        with self._lock:
            if not self._committed:
                self.given_up = True
            return self._committed

    def settle(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        """From the thread: hand ``result`` (or ``error``) to the handler's future."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(_set_future, future, result, error)


def _set_future(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class FairQueue:
    """Jobs by sender, taken one sender at a time in turn (round robin)."""

    def __init__(self) -> None:
        self._senders: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._ready = threading.Condition()
        self._closed = False

    def put(self, sender: str, job: _Job) -> None:
        with self._ready:
            self._senders.setdefault(sender, deque()).append(job)
            self._ready.notify()

    def get(self) -> _Job | None:
        """The next sender's oldest job; None once closed and empty."""
        with self._ready:
            while not self._senders and not self._closed:
                self._ready.wait()
            if not self._senders:
                return None
            sender, jobs = self._senders.popitem(last=False)
            job = jobs.popleft()
            if jobs:  # its next job waits for every other sender's turn
                self._senders[sender] = jobs
            return job

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class Ingest:
    """Owns the ingest thread; ``run`` is called from the event loop."""

    def __init__(
        self,
        aggregator: SpanAggregator,
        limits: otlp.Limits,
        *,
        memory: IngestMemory,
        decode_cpu_s: float,
    ) -> None:
        self.aggregator = aggregator
        self.limits = limits
        self.memory = memory
        self.decode_cpu_s = decode_cpu_s
        self.pending = 0  # jobs given to the thread and not yet left it (loop thread only)
        self._queue = FairQueue()
        self._thread = threading.Thread(target=self._serve, name="gpuscope-ingest", daemon=True)
        self._thread.start()

    async def run(
        self,
        body: bytes,
        content_encoding: str | None,
        media: str,
        *,
        sender: str,
        timeout_s: float,
        connected: Callable[[], bool],
        give_up: asyncio.Event,
        authenticated: bool = False,
    ) -> IngestResult:
        """Decompress, decode and aggregate ``body``; an ``OtlpError`` if it is refused,
        503 ``abandoned`` when it is not decoded within ``timeout_s`` or the client has
        gone (``connected()`` false), 503 ``shutting_down`` when ``give_up`` is set first.
        ``authenticated``: the sender passed authentication (its pid claims may join)."""
        job = _Job(body, content_encoding, media, authenticated)
        self.pending += 1
        self._queue.put(sender, job)
        try:
            await self._decoded(job, timeout_s, give_up)
        except asyncio.CancelledError:  # the server's last resort at shutdown
            job.give_up()
            job.decoded.cancel()
            raise
        if not connected():
            job.give_up()
        if not job.commit():
            raise otlp.OtlpError(503, ABANDONED, "the client left before the answer; retry")
        return await job.aggregated  # bounded by the caps: finishes soon

    async def _decoded(self, job: _Job, timeout_s: float, give_up: asyncio.Event) -> None:
        stop = asyncio.ensure_future(give_up.wait())
        try:
            await asyncio.wait((job.decoded, stop), timeout=timeout_s, return_when=FIRST_COMPLETED)
        finally:
            stop.cancel()
        if job.decoded.done():
            job.decoded.result()  # a refusal's OtlpError
            return
        job.give_up()
        job.decoded.cancel()  # what the thread hands over later is dropped
        if give_up.is_set():
            raise otlp.OtlpError(
                503, otlp.SHUTTING_DOWN, "the exporter is shutting down; send this request again"
            )
        raise otlp.OtlpError(
            503, ABANDONED, f"not decoded within {timeout_s:g} s (--ingest-timeout-s); retry"
        )

    def _serve(self) -> None:
        """The ingest thread."""
        while (job := self._queue.get()) is not None:
            try:
                self._one(job)
            finally:
                with contextlib.suppress(RuntimeError):
                    job.loop.call_soon_threadsafe(self._left)

    def _left(self) -> None:
        self.pending -= 1

    def _one(self, job: _Job) -> None:
        if job.given_up:  # its handler answered while it waited
            return
        try:
            request = self._decode(job)
        except GivenUp:
            return
        except BaseException as exc:  # handed to the handler, as executors do
            job.settle(job.decoded, None, exc)
            return
        job.settle(job.decoded, None, None)
        if not job.wait_for_decision():
            return
        try:
            job.settle(job.aggregated, self.aggregator.ingest(request, job.authenticated), None)
        except BaseException as exc:
            job.settle(job.aggregated, None, exc)

    def _decode(self, job: _Job) -> Any:
        """Decompressed within the memory budget, decoded within the CPU budget."""
        inflating = (job.content_encoding or "identity").strip().lower() != "identity"
        with self.memory.holding(self.limits.max_decompressed_bytes if inflating else 0) as held:
            data = otlp.decompress(job.body, job.content_encoding, self.limits)
            held.resize(len(data) if inflating else 0)
            if not needs_watching(data, job.media, self.decode_cpu_s):
                return decode_within_limits(data, job.media, self.limits)
            with cpu_budget(self.decode_cpu_s, lambda: job.given_up):
                return decode_within_limits(data, job.media, self.limits)

    def close(self) -> None:
        """Let the thread end once the jobs already given are done (without waiting)."""
        self._queue.close()
