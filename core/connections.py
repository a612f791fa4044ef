"""Connection hygiene for an asyncio HTTP server: timeouts for idle and slow clients, a
cap on open connections, ``accept()`` failures logged once per interval.

Free of any web framework, so that the exporter (aiohttp) and the worker (uvicorn)
can share it: every accepted connection is wrapped in a ``GuardedProtocol`` that
forwards the transport's calls to the server's own protocol and tells
``ConnectionGuard`` what the connection is doing. A connection is in one of three
states:

- idle: open, nothing received since it opened or since its last response.
  Closed after ``idle_timeout`` (the keep-alive timeout).
- head: the first bytes of a request arrived but no complete request head yet.
  Closed ``header_timeout`` after those first bytes (a client that sends its headers
  one byte at a time gets no more than that).
- busy: a request is being handled (the server marks it with ``request_started`` and
  ``request_finished``); no deadline of its own, the handler's limits apply. While a
  handler reads a body (``uploading``), the connection also notes since when.

At ``max_connections``, a new connection makes room by closing the oldest connection
that is not busy, so a well-behaved client still gets in while idle or slow clients
hold every slot. If every connection is busy, the one whose body has been uploading
longest is cut instead (its handler answers and closes it). Only when every
connection is busy and none is uploading is the new one answered ``refusal`` (a 503)
and closed. The cap also keeps the server below the process's file descriptor limit,
where ``accept()`` itself would start to fail: ``fit_to_descriptors`` sizes it with
the listen backlog, since asyncio accepts sockets a backlog at a time before any of
them reaches the guard.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
import resource
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

log = logging.getLogger(__name__)

# Connections the kernel queues for ``accept()``, and how many asyncio accepts in one go
# when a listening socket is readable: each takes a descriptor before the cap can shed
# anything. Between its accept() and the moment the cap has shed (and closed) an older
# connection for it, a socket waits through up to ``IN_TRANSIT_BATCHES`` turns of the
# event loop (accepted; transport made; admitted, an old one closed; that one's
# descriptor released), and each turn accepts another batch per listening socket; so
# that many backlogs are kept free under the descriptor limit, plus the server's own
# ``OWN_FDS`` (standard streams, listening sockets, epoll, outgoing connections, the
# libraries' own). The kernel makes clients past the backlog wait (SYN retries).
# (Figures of the exporter's hardening, where a reserve of 64 against asyncio's backlog
# of 128 let bursts make accept() fail 465 times in 11 s.)
LISTEN_BACKLOG: Final = 32
IN_TRANSIT_BATCHES: Final = 4
OWN_FDS: Final = 64
CLOSE_REASONS: Final = (
    "idle_timeout",
    "header_timeout",
    "shed_at_cap",
    "refused_at_cap",
    "shutdown",
)
PLAIN_REFUSAL: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 27\r\n\r\ntoo many connections, retry"
)

# The connection whose bytes are being handed to the server's protocol right now. A
# server that starts a request's task from ``data_received`` (uvicorn does) gives the
# task a copy of this context, so the request can find its connection without a
# lookup by peer address, which proxy headers may have rewritten by then.
_current: contextvars.ContextVar[GuardedProtocol | None] = contextvars.ContextVar(
    "gpuscope_connection", default=None
)


def current_connection() -> GuardedProtocol | None:
    """The guarded connection whose data started the running task, if any."""
    return _current.get()


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 512
    header_timeout: float = 10.0
    idle_timeout: float = 60.0


class State(enum.Enum):
    IDLE = "idle"
    HEAD = "head"
    BUSY = "busy"


def _soft_fd_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def listen_backlog() -> int:
    """``LISTEN_BACKLOG``, or less under a small descriptor limit (a sixteenth of what is
    not the server's own, at least 8), so that the cap keeps most of it."""
    soft = _soft_fd_limit()
    if soft is None:
        return LISTEN_BACKLOG
    return max(8, min(LISTEN_BACKLOG, (soft - OWN_FDS) // 16))


def fit_to_descriptors(
    wanted: int, backlog: int, listeners: int, *, said: int | None = None
) -> int:
    """``wanted`` connections, lowered if they, the sockets in transit through
    ``listeners`` listening sockets of ``backlog`` and ``OWN_FDS`` do not fit under the
    soft descriptor limit (a warning says so, unless the cap is ``said`` already)."""
    soft = _soft_fd_limit()
    reserve = OWN_FDS + IN_TRANSIT_BATCHES * backlog * listeners
    if soft is None or wanted + reserve <= soft:
        return wanted
    fitted = max(1, soft - reserve)
    if fitted == said:
        return fitted
    log.warning(
        "--max-connections %d does not fit the file descriptor limit %d; using %d",
        wanted, soft, fitted,
    )  # fmt: skip
    return fitted


class GuardedProtocol(asyncio.Protocol):
    """A server's protocol for one connection, with the guard's deadlines around it."""

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
        token = _current.set(self)
        try:
            self.inner.data_received(data)
        finally:
            _current.reset(token)

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
    """The open connections of one server, oldest first, and what each is doing.

    ``refusal`` is what a connection refused at the cap is sent before it is closed
    (a complete HTTP/1.1 response); ``linger_s`` how long a cut upload may take to be
    answered. Listen with ``backlog``, and call ``listening_on`` with the number of
    listening sockets before accepting (one is assumed until then)."""

    def __init__(
        self, limits: ConnectionLimits, *, refusal: bytes = PLAIN_REFUSAL, linger_s: float = 2.0
    ) -> None:
        self.limits = limits
        self.refusal = refusal
        self.linger_s = linger_s
        self.backlog = listen_backlog()
        self.max_connections = limits.max_connections
        self.listening_on(1)
        self.closed_by_reason: Counter[str] = Counter({reason: 0 for reason in CLOSE_REASONS})
        # transport -> its connection, oldest first (dicts keep insertion order)
        self._open: dict[object, GuardedProtocol] = {}
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopping = False  # set by the server when it stops accepting

    def listening_on(self, listeners: int) -> None:
        """Fit the cap to the descriptor limit for ``listeners`` listening sockets."""
        self.max_connections = fit_to_descriptors(
            self.limits.max_connections, self.backlog, listeners, said=self.max_connections
        )

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
            self.closed_by_reason["refused_at_cap"] += 1
            connection.transport.write(self.refusal)
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
        ``cut`` set, answers and closes it, within ``linger_s`` at the latest."""
        uploads = [c for c in self._open.values() if c.uploading_since is not None]
        if not uploads:
            return False
        oldest = min(uploads, key=lambda c: c.uploading_since or 0.0)
        del self._open[oldest.transport]
        self._request_done()  # ``request_finished`` skips a connection no longer open
        oldest.cut.set()
        oldest.close_later(self.linger_s)
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
