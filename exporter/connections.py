"""Connection hygiene: timeouts for idle and slow clients, a cap on open connections.

Every accepted connection is wrapped in a ``GuardedProtocol`` that forwards the
transport's calls to aiohttp's own protocol and tells ``ConnectionGuard`` what the
connection is doing. A connection is in one of three states:

- idle: open, nothing received since it opened or since its last response.
  Closed after ``idle_timeout`` (the keep-alive timeout).
- head: the first bytes of a request arrived but no complete request head yet.
  Closed ``header_timeout`` after those first bytes (a client that sends its headers
  one byte at a time gets no more than that).
- busy: a request is being handled (``request_middleware`` marks it); no deadline
  of its own, the handler's limits apply (``--body-timeout-s`` for a body). While the
  handler reads a body (``uploading``), the connection also notes since when.

At ``max_connections``, a new connection makes room by closing the oldest connection
that is not busy, so a well-behaved scraper still gets ``/metrics`` while idle or
slow clients hold every slot. If every connection is busy, the one whose body has been
uploading longest is cut instead: its handler answers 503 and closes it, so slow
uploaders cannot lock a scraper out either. Only when every connection is busy and
none is uploading is the new one answered 503 and closed. The cap also keeps the
exporter below the process's file descriptor limit, where ``accept()`` itself would
start to fail.

Shutdown uses the same bookkeeping: ``close_idle`` closes every connection that is
not busy, ``wait_until_idle`` returns as soon as no request is in flight.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.definitions import (
    HTTP_CONNECTIONS,
    HTTP_CONNECTIONS_CLOSED,
    HTTP_CONNECTIONS_MAX,
)

log = logging.getLogger(__name__)

# File descriptors kept free for everything that is not a client connection
# (listening socket, log files, the forwarder's and the GPU library's own).
RESERVED_FDS = 64
CLOSE_REASONS = ("idle_timeout", "header_timeout", "shed_at_cap", "refused_at_cap", "shutdown")
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


class State(enum.Enum):
    IDLE = "idle"
    HEAD = "head"
    BUSY = "busy"


def effective_max_connections(wanted: int) -> int:
    """``wanted``, lowered to fit under the soft file-descriptor limit if it must be."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or wanted + RESERVED_FDS <= soft:
        return wanted
    fitted = max(1, soft - RESERVED_FDS)
    log.warning(
        "--max-connections %d does not fit the file descriptor limit %d; using %d",
        wanted, soft, fitted,
    )  # fmt: skip
    return fitted


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's deadlines around it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.state = State.IDLE
        self.transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        # loop time at which the handler began reading a body; None while it is not
        self.uploading_since: float | None = None
        self.cut = asyncio.Event()  # set when the cap sheds this upload

    # --- asyncio.Protocol, forwarded --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.inner.connection_made(transport)
        self.guard.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.state is State.IDLE and not self.cut.is_set():  # a cut one only lingers
            self.state = State.HEAD
            self.set_deadline(self.guard.limits.header_timeout, "header_timeout")
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_deadline()
        self.guard.closed(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # --- deadlines ----------------------------------------------------------------------

    def set_deadline(self, seconds: float, reason: str) -> None:
        self.cancel_deadline()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self.close, reason)

    def cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def close_later(self, seconds: float) -> None:
        """Close the connection after ``seconds`` unless it is closed before (uncounted)."""
        assert self.transport is not None
        self.cancel_deadline()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self.transport.close)

    def close(self, reason: str) -> None:
        """Close the connection now, counted under ``reason``."""
        if self.transport is not None and not self.transport.is_closing():
            self.guard.closed_by_reason[reason] += 1
            self.transport.close()


class ConnectionGuard:
    """The open connections of one server, oldest first, and what each is doing."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.max_connections = effective_max_connections(limits.max_connections)
        self.closed_by_reason: Counter[str] = Counter({reason: 0 for reason in CLOSE_REASONS})
        # transport -> its connection, oldest first (dicts keep insertion order)
        self._open: dict[object, GuardedProtocol] = {}
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopping = False  # set by the server when it stops accepting

    def protocol_factory(self, make_inner: Callable[[], Any]) -> Callable[[], GuardedProtocol]:
        return lambda: GuardedProtocol(self, make_inner())

    def __len__(self) -> int:
        return len(self._open)

    @property
    def busy(self) -> int:
        return self._busy

    def opened(self, connection: GuardedProtocol) -> None:
        assert connection.transport is not None
        at_cap = len(self._open) >= self.max_connections
        if at_cap and not self._shed_one() and not self._cut_oldest_upload():
            connection.guard.closed_by_reason["refused_at_cap"] += 1
            connection.transport.write(_REFUSAL)
            connection.transport.close()
            return
        self._open[connection.transport] = connection
        connection.set_deadline(self.limits.idle_timeout, "idle_timeout")

    def closed(self, connection: GuardedProtocol) -> None:
        known = self._open.pop(connection.transport, None) is not None
        if known and connection.state is State.BUSY:
            self._request_done()

    def _shed_one(self) -> bool:
        """Close the oldest connection that is not handling a request; False if none."""
        for connection in self._open.values():
            if connection.state is not State.BUSY:
                connection.close("shed_at_cap")
                del self._open[connection.transport]
                return True
        return False

    def _cut_oldest_upload(self) -> bool:
        """Cut the busy connection whose body has been uploading longest; False if none.

        It leaves the books at once (the newcomer takes its slot); its handler sees
        ``cut`` set, answers 503 and closes it, within ``LINGER_S`` at the latest."""
        uploads = [c for c in self._open.values() if c.uploading_since is not None]
        if not uploads:
            return False
        oldest = min(uploads, key=lambda c: c.uploading_since or 0.0)
        del self._open[oldest.transport]
        self._request_done()  # ``request_finished`` skips a connection no longer open
        oldest.cut.set()
        oldest.close_later(LINGER_S)
        self.closed_by_reason["shed_at_cap"] += 1
        return True

    # --- requests -------------------------------------------------------------------

    def request_started(self, transport: object) -> GuardedProtocol | None:
        connection = self._open.get(transport)
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
        if connection.transport in self._open:
            connection.set_deadline(self.limits.idle_timeout, "idle_timeout")
            self._request_done()

    @contextmanager
    def uploading(self, transport: object) -> Iterator[asyncio.Event]:
        """Around a handler's body read: marks the connection as uploading, so that the
        cap may cut it; yields the event that says it was cut."""
        connection = self._open.get(transport)
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
            connection = self.request_started(request.transport)
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
