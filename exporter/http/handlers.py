"""The exporter's request handlers.

``POST /v1/traces`` (OTLP/HTTP, protobuf or JSON, optionally gzipped), ``GET /metrics``
(text, or OpenMetrics with exemplars when asked; gzip when accepted), ``GET /healthz``
(serving), ``GET /readyz`` (started, first GPU poll done, no poll stuck, NVML not released, not
shutting down); ``/healthz`` fails only when the GPU source cannot heal without a
restart (a driver upgraded under it).

Export requests are decoded and aggregated in the ingest thread (``pipeline``), one at
a time, senders in turn, the only writer of the aggregator's series; the bytes they hold
meanwhile are bounded (``memory``); the self-monitoring counters change
on the event loop's thread. A scrape renders in worker threads (reading each series
consistently, see ``series``), so neither a large ``/metrics`` nor a large export
request holds up the other, or the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import FIRST_COMPLETED
from functools import partial

from aiohttp import HttpVersion11, hdrs, web

from gpuscope import spans
from gpuscope.exporter.http.auth import was_authenticated
from gpuscope.exporter.http.render import content_type_for, scrape_pieces
from gpuscope.exporter.http.routes import otlp_error
from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.ingest.memory import INGEST_MEMORY_FULL
from gpuscope.exporter.state import STATE, ExporterState
from gpuscope.exposition import VARY, gzip_wanted

log = logging.getLogger(__name__)

# Reasons after which the connection closes instead of reading the rest of the body.
_BODY_LEFT_UNREAD = frozenset((otlp.BODY_TIMEOUT, otlp.SHED_AT_CAP, INGEST_MEMORY_FULL))


async def receive_traces(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        media = otlp.media_type(request.headers.get(hdrs.CONTENT_TYPE))
        _check_declared_length(request, state)
        # the body's share of --max-ingest-bytes, taken before it is read
        with state.ingest.memory.holding(_most_it_can_hold(request, state)) as held:
            body = await _read_body(request, state)
            held.resize(len(body))
            result = await state.ingest.run(
                body,
                request.headers.get(hdrs.CONTENT_ENCODING),
                media,
                sender=request.remote or "",
                timeout_s=state.config.ingest_timeout_s,
                connected=partial(_connected, request),
                give_up=state.drain_expired,
                authenticated=was_authenticated(request),
            )
    except otlp.OtlpError as exc:
        return _refused(request, state, exc)
    state.metrics.spans_received += result.received
    state.metrics.spans_rejected.update(result.rejected)
    if state.forwarder is not None and result.received:
        state.forwarder.submit(
            body, media, request.headers.get(hdrs.CONTENT_ENCODING), result.received
        )
    answer = otlp.encode_response(media, result.rejected_total, result.error_message())
    # Tells the sender's span exporter whether phase child spans reach a trace view here
    # (the middleware emits them only then, unless told otherwise).
    kept = spans.PHASE_SPANS_FORWARDED if state.forwarder is not None else spans.PHASE_SPANS_DROPPED
    return web.Response(body=answer, content_type=media, headers={spans.PHASE_SPANS_HEADER: kept})


def _most_it_can_hold(request: web.Request, state: ExporterState) -> int:
    """The body's declared length, else the most it may be."""
    if request.content_length is not None:
        return request.content_length
    return state.limits.max_body_bytes


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


def _refused(request: web.Request, state: ExporterState, exc: otlp.OtlpError) -> web.Response:
    """The answer to an export request refused as a whole, counted by reason."""
    state.metrics.requests_rejected[exc.reason] += 1
    log.debug("rejected export request: %s", exc)
    # Error bodies follow the request's format when it is one of ours, else protobuf.
    reply_media = otlp.JSON if request.content_type == otlp.JSON else otlp.PROTOBUF
    response = otlp_error(reply_media, exc.status, str(exc))
    if exc.status in (429, 503):  # the OpenTelemetry SDK retries these after Retry-After
        response.headers[hdrs.RETRY_AFTER] = "1"
    if exc.reason in _BODY_LEFT_UNREAD:  # the rest of the body is not waited for
        response.force_close()
    return response


async def expect_traces_body(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` on ``/v1/traces``: a declared length over
    ``--max-body-bytes`` is answered 413 at once, so the client is never invited to send
    a body that would be refused. Otherwise the ``100 Continue`` aiohttp would send."""
    state = request.app[STATE]
    try:
        _check_declared_length(request, state)
    except otlp.OtlpError as exc:
        response = _refused(request, state, exc)
        response.force_close()  # the client may send the body anyway: do not parse it
        return response
    if request.version != HttpVersion11:
        return None
    if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers[hdrs.EXPECT]}")
    # Straight to the transport (nothing of this response is written yet, so nothing
    # can come before it): the response's writer never counts the interim answer, so
    # aiohttp still sees a response not yet begun (an error can still be answered) and
    # its size stays the real answer's, without resetting the writer's private count.
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return None


def _check_declared_length(request: web.Request, state: ExporterState) -> None:
    limit = state.limits.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise otlp.OtlpError(
            413, otlp.BODY_TOO_LARGE, f"body of {request.content_length} bytes exceeds {limit}"
        )


async def _read_body(request: web.Request, state: ExporterState) -> bytes:
    limit = state.limits.max_body_bytes
    try:
        with state.guard.uploading(request.protocol) as cut:
            return await _read_within(
                request, state.config.body_timeout_s, cut, state.drain_expired
            )
    except web.HTTPRequestEntityTooLarge:
        raise otlp.OtlpError(413, otlp.BODY_TOO_LARGE, f"body exceeds {limit} bytes") from None


async def _read_within(
    request: web.Request, timeout_s: float, cut: asyncio.Event, shutdown: asyncio.Event
) -> bytes:
    """The body, if it is all in within ``timeout_s`` (408 ``OtlpError`` if not), before
    the cap cuts this upload (503) and before the shutdown timeout runs out (503)."""
    reading = asyncio.ensure_future(request.read())
    stops = [asyncio.ensure_future(event.wait()) for event in (cut, shutdown)]
    try:
        await asyncio.wait((reading, *stops), timeout=timeout_s, return_when=FIRST_COMPLETED)
    except asyncio.CancelledError:
        reading.cancel()
        raise
    finally:
        for stop in stops:
            stop.cancel()
    # checked last, with no await after it: once the upload ends it can no longer be cut
    if cut.is_set() or not reading.done():
        reading.cancel()
        raise _stopped_early(cut, shutdown, timeout_s)
    try:
        return reading.result()
    except ConnectionResetError:  # the client went away mid-upload
        raise otlp.OtlpError(
            400, otlp.INCOMPLETE_BODY, "connection closed before the body was complete"
        ) from None


def _stopped_early(cut: asyncio.Event, shutdown: asyncio.Event, timeout_s: float) -> otlp.OtlpError:
    if cut.is_set():
        return otlp.OtlpError(
            503, otlp.SHED_AT_CAP, "too many connections: the slowest upload was cut; retry"
        )
    if shutdown.is_set():
        return otlp.OtlpError(
            503, otlp.SHUTTING_DOWN, "the exporter is shutting down; send this request again"
        )
    return otlp.OtlpError(408, otlp.BODY_TIMEOUT, f"the body did not arrive within {timeout_s:g} s")


async def serve_metrics(request: web.Request) -> web.StreamResponse:
    """The scrape, rendered (and compressed) a piece at a time in a worker thread so that
    ingest goes on meanwhile (each series is read consistently, see ``series``), each
    piece written before the next is made: a client that does not read holds one piece,
    not the whole scrape. One render at a time, taken piece by piece, so a slow reader
    holds up no other scrape. A scrape that fits one piece goes out with its length."""
    state = request.app[STATE]
    accept = request.headers.get(hdrs.ACCEPT, "")
    compress = gzip_wanted(request.headers.get(hdrs.ACCEPT_ENCODING, ""))
    pieces = scrape_pieces(state.registry, state.aggregator.histograms, accept, compress)
    next_piece = partial(next, pieces, b"")

    async def render_next() -> bytes:
        async with state.render_lock:
            return await asyncio.to_thread(next_piece)

    headers = {hdrs.CONTENT_TYPE: content_type_for(accept), hdrs.VARY: VARY}
    if compress:
        headers[hdrs.CONTENT_ENCODING] = "gzip"
    first, piece = await render_next(), await render_next()
    if not piece:
        return web.Response(body=first, headers=headers)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    try:
        await response.write(first)
        del first
        while piece:
            await response.write(piece)  # waits while the client's socket is full
            piece = await render_next()
        await response.write_eof()
    except ConnectionError:  # the client left, or was cut for not reading: no traceback
        log.debug("scrape client gone before the end of /metrics")
    return response


async def healthz(request: web.Request) -> web.Response:
    """200 unless the GPU source cannot heal in this process (a restart can)."""
    poller = request.app[STATE].poller
    why = poller.unrecoverable() if poller is not None else None
    if why is not None:
        return web.Response(status=503, text=f"unhealthy: {why}\n")
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if not state.started or state.stopping:
        return web.Response(status=503, text="not ready: starting or stopping\n")
    why = state.poller.unready() if state.poller is not None else None
    if why is not None:  # first poll pending, a poll stuck, NVML released
        return web.Response(status=503, text=f"not ready: {why}\n")
    return web.Response(text="ready\n")
