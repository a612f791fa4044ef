"""Connection hygiene: timeouts for idle, slow and non-reading clients, a cap on open
connections.

Every accepted socket is wrapped, from its ``accept()``, in a ``GuardedProtocol`` that
forwards the transport's calls to what serves it (aiohttp's protocol; for TLS,
asyncio's ``SSLProtocol`` with aiohttp's under it) and tells ``ConnectionGuard`` what
the connection is doing. So a TLS connection counts against the cap while its
handshake runs: before, a connection only became visible once its handshake was done,
and 400 clients stuck in theirs exhausted a 300-descriptor limit. A connection is in
one of three states:

- idle: open, nothing received since it opened or since its last response.
  Closed after ``idle_timeout`` (the keep-alive timeout).
- head: the first bytes of a request (or of a TLS handshake) arrived but no complete
  request head yet. Closed ``header_timeout`` after those first bytes (a client that
  sends its headers one byte at a time gets no more than that).
- busy: a request is being handled (``request_middleware`` marks it); no deadline
  of its own, the handler's limits apply (``--body-timeout-s`` for a body). While the
  handler reads a body (``uploading``), the connection also notes since when.

Whatever the state, a connection whose client stops reading is *stalled*: the
transport holds more than its high-water mark (64 KiB) of answer that the client has
not taken. Closed (aborted: the unsent bytes cannot go anyway) after ``write_timeout``
of that; any byte the client reads that brings the buffer back under the low-water
mark restarts the clock.

At ``max_connections``, a new connection makes room by closing the oldest connection
that is not busy, so a well-behaved scraper still gets ``/metrics`` while idle or
slow clients hold every slot. If every connection is busy, the one that has been
uploading its body or stalled on its answer longest is cut instead: an upload's
handler answers 503 and closes it, a stalled one is aborted; so neither slow uploaders
nor clients that never read their scrape can lock a scraper out. Only when every
connection is busy and none is uploading or stalled is the new one refused (503 on
plain HTTP; a TLS one is closed, since no handshake was made to answer it). The cap
also keeps the exporter below the process's file descriptor limit, where ``accept()``
itself would start to fail: enough descriptors are kept free for the sockets asyncio
accepts before any of them can be shed, plus the exporter's own (``fit_to_descriptors``).

Shutdown uses the same bookkeeping: ``close_idle`` closes every connection that is
not busy, ``wait_until_idle`` returns as soon as no request is in flight.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
import ssl
from asyncio import sslproto
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import hdrs, web
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.definitions import (
    HTTP_CONNECTIONS,
    HTTP_CONNECTIONS_CLOSED,
    HTTP_CONNECTIONS_MAX,
)

log = logging.getLogger(__name__)

# Connections the kernel queues for ``accept()``, and how many asyncio accepts in one
# go when a listening socket is readable: each takes a descriptor before the cap can
# shed anything. Between its accept() and the moment the cap has shed (and closed) an
# older connection for it, a socket waits through up to ``IN_TRANSIT_BATCHES`` turns of
# the event loop (accepted; transport made; admitted, an old one closed; that one's
# descriptor released), and each turn accepts another batch per listening socket. So
# that many backlogs are kept free under the descriptor limit, plus the exporter's own.
# Before, 64 were kept free against a backlog of 128, and bursts of new connections made
# ``accept()`` fail (465 times in 11 s). 32 (aiohttp's default is 128) keeps the reserve
# small enough that the default cap of 512 fits the usual limit of 1,024 with two
# listening sockets (``--listen :9420``: IPv4 and IPv6); the kernel makes clients
# beyond it wait (SYN retries), nothing fails.
LISTEN_BACKLOG: Final = 32
IN_TRANSIT_BATCHES: Final = 4
# Descriptors of the exporter's own: standard streams, the listening sockets, epoll and
# its wake-up pipe, the forwarder's connection, the GPU library's.
OWN_FDS: Final = 64
CLOSE_REASONS = (
    "idle_timeout",
    "header_timeout",
    "write_timeout",
    "shed_at_cap",
    "refused_at_cap",
    "shutdown",
)
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 27\r\n\r\ntoo many connections, retry"
)
# After an answer sent before its request's body was all in (408, 503, 413...): how long
# the rest is read and dropped before closing, so that the client can read the answer
# (closing with bytes unread sends a TCP reset, which can discard it). aiohttp's
# ``lingering_time``; also the bound on a cut upload's last answer.
LINGER_S = 2.0


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 512
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    write_timeout: float = 30.0


class State(enum.Enum):
    IDLE = "idle"
    HEAD = "head"
    BUSY = "busy"


def _soft_fd_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def listen_backlog() -> int:
    """``LISTEN_BACKLOG``, or less under a small descriptor limit (a sixteenth of what
    is not the exporter's own, at least 8), so that the cap keeps most of it."""
    soft = _soft_fd_limit()
    if soft is None:
        return LISTEN_BACKLOG
    return max(8, min(LISTEN_BACKLOG, (soft - OWN_FDS) // 16))


def fit_to_descriptors(wanted: int, backlog: int, listeners: int) -> int:
    """``wanted`` connections, lowered if they, the sockets in transit through
    ``listeners`` listening sockets of ``backlog`` and ``OWN_FDS`` do not fit under
    the soft descriptor limit."""
    soft = _soft_fd_limit()
    reserve = OWN_FDS + IN_TRANSIT_BATCHES * backlog * listeners
    if soft is None or wanted + reserve <= soft:
        return wanted
    fitted = max(1, soft - reserve)
    log.warning(
        "--max-connections %d does not fit the file descriptor limit %d; using %d",
        wanted, soft, fitted,
    )  # fmt: skip
    return fitted


class GuardedProtocol(asyncio.Protocol):
    """The protocol of one accepted socket: the guard's deadlines around ``inner``
    (aiohttp's protocol, ``handler``, or the ``SSLProtocol`` in front of it)."""

    def __init__(
        self,
        guard: ConnectionGuard,
        inner: asyncio.Protocol | asyncio.BufferedProtocol,
        handler: object,
    ) -> None:
        self.guard = guard
        self.inner = inner
        self.handler = handler  # what aiohttp gives handlers as ``request.protocol``
        self.admitted = False  # False: refused at the cap, ``inner`` never started
        self.state = State.IDLE
        self.transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        # loop time at which the handler began reading a body; None while it is not
        self.uploading_since: float | None = None
        # loop time since which the client has not read its answer; None if it does
        self.stalled_since: float | None = None
        self.cut = asyncio.Event()  # set when the cap sheds this upload

    # --- asyncio.Protocol, forwarded --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.admitted = self.guard.admit(self)
        if self.admitted:
            self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.received()
        assert isinstance(self.inner, asyncio.Protocol)
        self.inner.data_received(data)

    def received(self) -> None:
        if self.state is State.IDLE and not self.cut.is_set():  # a cut one only lingers
            self.state = State.HEAD
            self.set_deadline(self.guard.limits.header_timeout, "header_timeout")

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_deadline()
        self._cancel_stall()
        self.guard.closed(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        loop = asyncio.get_running_loop()
        self.stalled_since = loop.time()
        self._stall = loop.call_later(self.guard.limits.write_timeout, self.close, "write_timeout")
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self._cancel_stall()
        self.inner.resume_writing()

    # --- deadlines ----------------------------------------------------------------------

    def set_deadline(self, seconds: float, reason: str) -> None:
        self.cancel_deadline()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self.close, reason)

    def cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _cancel_stall(self) -> None:
        self.stalled_since = None
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def close_later(self, seconds: float) -> None:
        """Close the connection after ``seconds`` unless it is closed before (uncounted)."""
        assert self.transport is not None
        self.cancel_deadline()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._close_now)

    def close(self, reason: str) -> None:
        """Close the connection now, counted under ``reason``."""
        if self.transport is not None and not self.transport.is_closing():
            self.guard.closed_by_reason[reason] += 1
            self._close_now()

    def _close_now(self) -> None:
        assert self.transport is not None
        if self.transport.get_write_buffer_size():
            # A plain close would wait for the client to take what is buffered, which a
            # client that does not read never does: the descriptor would stay open.
            self.transport.abort()
        else:
            self.transport.close()


class GuardedBufferedProtocol(GuardedProtocol, asyncio.BufferedProtocol):
    """A ``GuardedProtocol`` in front of a buffered protocol (asyncio's ``SSLProtocol``)."""

    def get_buffer(self, sizehint: int) -> Any:
        assert isinstance(self.inner, asyncio.BufferedProtocol)
        return self.inner.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.received()
        assert isinstance(self.inner, asyncio.BufferedProtocol)
        self.inner.buffer_updated(nbytes)


class ConnectionGuard:
    """The open connections of one server, oldest first, and what each is doing."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.backlog = listen_backlog()
        # Fitted to the descriptor limit by ``listening_on`` once the sockets are made.
        self.max_connections = limits.max_connections
        self.closed_by_reason: Counter[str] = Counter({reason: 0 for reason in CLOSE_REASONS})
        # aiohttp's protocol -> its connection, oldest first (dicts keep insertion order)
        self._open: dict[object, GuardedProtocol] = {}
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopping = False  # set by the server when it stops accepting
        # The TLS context new connections get; None serves plain HTTP. Read at each
        # accept, so a reloaded web config applies to the next connection.
        self.tls: ssl.SSLContext | None = None

    def protocol_factory(self, make_handler: Callable[[], Any]) -> Callable[[], GuardedProtocol]:
        """What the listener calls at each ``accept()``: aiohttp's protocol from
        ``make_handler``, behind TLS when ``tls`` is set, behind the guard always."""

        def new_connection() -> GuardedProtocol:
            handler = make_handler()
            if self.tls is None:
                return GuardedProtocol(self, handler, handler)
            loop = asyncio.get_running_loop()
            # Told how the handshake ended; a failed one has closed the socket already,
            # its error (a scanner, a plain-HTTP client) is not worth a log line.
            handshake: asyncio.Future[None] = loop.create_future()
            handshake.add_done_callback(_ignore_outcome)
            wrapped = sslproto.SSLProtocol(
                loop,
                handler,
                self.tls,
                handshake,
                server_side=True,
                # a TLS client gets no longer for its handshake than for its headers
                # (typeshed says int; asyncio takes any number of seconds)
                ssl_handshake_timeout=self.limits.header_timeout,  # type: ignore[arg-type]
                ssl_shutdown_timeout=LINGER_S,
            )
            return GuardedBufferedProtocol(self, wrapped, handler)

        return new_connection

    def listening_on(self, listeners: int) -> None:
        """Fit the cap to the descriptor limit, given the number of listening sockets
        (before any connection is accepted)."""
        self.max_connections = fit_to_descriptors(
            self.limits.max_connections, self.backlog, listeners
        )

    def __len__(self) -> int:
        return len(self._open)

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def stalled(self) -> int:
        """Connections whose client is not reading what it was sent."""
        return sum(c.stalled_since is not None for c in self._open.values())

    def admit(self, connection: GuardedProtocol) -> bool:
        """Take a new connection on the books, making room at the cap; False if it was
        refused (and closed) instead."""
        assert connection.transport is not None
        at_cap = len(self._open) >= self.max_connections
        if at_cap and not self._shed_one() and not self._cut_oldest():
            self.closed_by_reason["refused_at_cap"] += 1
            if isinstance(connection, GuardedBufferedProtocol):  # TLS: no plaintext 503
                connection.transport.abort()
            else:
                connection.transport.write(_REFUSAL)
                connection.transport.close()
            return False
        self._open[connection.handler] = connection
        connection.set_deadline(self.limits.idle_timeout, "idle_timeout")
        return True

    def closed(self, connection: GuardedProtocol) -> None:
        known = self._open.pop(connection.handler, None) is connection
        if known and connection.state is State.BUSY:
            self._request_done()

    def _shed_one(self) -> bool:
        """Close the oldest connection that is not handling a request; False if none."""
        for connection in self._open.values():
            if connection.state is not State.BUSY:
                connection.close("shed_at_cap")
                del self._open[connection.handler]
                return True
        return False

    def _cut_oldest(self) -> bool:
        """Cut the busy connection that has been uploading its body or stalled on its
        answer longest; False if none is doing either.

        It leaves the books at once (the newcomer takes its slot). A stalled one is
        aborted now; an upload's handler sees ``cut`` set, answers 503 and closes it,
        within ``LINGER_S`` at the latest."""
        waiting = [
            (since, connection)
            for connection in self._open.values()
            if (since := _first(connection.uploading_since, connection.stalled_since)) is not None
        ]
        if not waiting:
            return False
        _, oldest = min(waiting, key=lambda item: item[0])
        del self._open[oldest.handler]
        self._request_done()  # ``request_finished`` skips a connection no longer open
        self.closed_by_reason["shed_at_cap"] += 1
        if oldest.uploading_since is not None:
            oldest.cut.set()
            oldest.close_later(LINGER_S)
        else:
            oldest._close_now()
        return True

    # --- requests -------------------------------------------------------------------

    def request_started(self, handler: object) -> GuardedProtocol | None:
        connection = self._open.get(handler)
        if connection is None or connection.state is State.BUSY:
            return None
        connection.state = State.BUSY
        connection.cancel_deadline()
        self._busy += 1
        self._idle.clear()
        return connection

    def request_finished(self, connection: GuardedProtocol) -> None:
        if connection.state is not State.BUSY:
            return
        connection.state = State.IDLE
        if self._open.get(connection.handler) is connection:
            connection.set_deadline(self.limits.idle_timeout, "idle_timeout")
            self._request_done()

    @contextmanager
    def uploading(self, handler: object) -> Iterator[asyncio.Event]:
        """Around a handler's body read (``handler`` is ``request.protocol``): marks the
        connection as uploading, so that the cap may cut it; yields the event that says
        it was cut."""
        connection = self._open.get(handler)
        if connection is None:  # not one of ours (or already cut): never cut
            yield asyncio.Event()
            return
        connection.uploading_since = asyncio.get_running_loop().time()
        try:
            yield connection.cut
        finally:
            connection.uploading_since = None

    def _request_done(self) -> None:
        self._busy -= 1
        if self._busy == 0:
            self._idle.set()

    # --- shutdown -------------------------------------------------------------------

    def close_idle(self) -> None:
        """Close every connection that is not handling a request."""
        for connection in list(self._open.values()):
            if connection.state is not State.BUSY:
                connection.close("shutdown")

    async def wait_until_idle(self, timeout_s: float) -> bool:
        """True as soon as no request is in flight; False if some still are after
        ``timeout_s``."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def request_middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        """Marks each connection busy while its request is handled; while the server is
        stopping, responses close their connection."""

        @web.middleware
        async def track_request(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            connection = self.request_started(request.protocol)
            try:
                response = await handler(request)
            finally:
                if connection is not None:
                    self.request_finished(connection)
            if self.stopping:
                response.force_close()
                response.headers[hdrs.CONNECTION] = "close"
            return response

        return track_request


def _ignore_outcome(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so asyncio does not log it as forgotten


def _first(*times: float | None) -> float | None:
    """The earliest of the times that are set."""
    present = [t for t in times if t is not None]
    return min(present) if present else None


class AcceptErrorLog:
    """A loop exception handler that logs ``accept()`` failures (out of file descriptors
    or memory) once per ``interval_s`` with a count, instead of a traceback per attempt;
    everything else goes to the handler that was there before."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = 10.0) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.suppressed = 0
        self._last = -interval_s
        self._previous = loop.get_exception_handler()

    def __enter__(self) -> AcceptErrorLog:
        self.loop.set_exception_handler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.loop.set_exception_handler(self._previous)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            if self._previous is not None:
                self._previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = loop.time()
        if now - self._last < self.interval_s:
            self.suppressed += 1
            return
        log.error(
            "accepting connections fails: %s (%d more such failures since the last report; "
            "lower --max-connections or raise the file descriptor limit)",
            context.get("exception"), self.suppressed,
        )  # fmt: skip
        self._last, self.suppressed = now, 0


class ConnectionCollector(Collector):
    """``gpuscope_http_connections`` (open, busy) and closes by reason."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        guard = self.guard
        open_now = HTTP_CONNECTIONS.family()
        open_now.add_metric(["busy"], guard.busy)
        open_now.add_metric(["waiting"], len(guard) - guard.busy)
        yield open_now
        yield HTTP_CONNECTIONS_MAX.one_value(guard.max_connections)
        closed = HTTP_CONNECTIONS_CLOSED.family()
        for reason, count in sorted(guard.closed_by_reason.items()):
            closed.add_metric([reason], count)
        yield closed
