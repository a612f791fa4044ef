"""Connection hygiene for an asyncio HTTP server: timeouts for idle, slow and
non-reading clients, a cap on open connections, ``accept()`` failures logged once per
interval, and the listen backlog and cap sized under the file descriptor limit.

Free of any web framework, so that the exporter (aiohttp) and the worker (uvicorn)
share it; each keeps only its wiring (which requests mark a connection busy, how the
server's protocol is made) and its metrics. Every accepted socket is wrapped, from its
``accept()``, in a ``GuardedProtocol`` that forwards the transport's calls to the
server's own protocol and tells ``ConnectionGuard`` what the connection is doing. For
TLS (``ConnectionGuard.tls``) the socket is accepted plain and the guarded protocol
upgrades it with asyncio's public ``loop.start_tls`` (the handshake bounded by the
header timeout), so a TLS connection counts against the cap while its handshake
runs: were TLS layered by ``create_server(ssl=...)``, a connection would only become
visible once its handshake was done, and 400 clients stuck in theirs exhausted a
300-descriptor limit. A connection is in one of three states:

- idle: open, nothing received since it opened or since its last response.
  Closed after ``idle_timeout`` (the keep-alive timeout).
- head: the first bytes of a request arrived but no complete request head yet.
  Closed ``header_timeout`` after those first bytes (a client that sends its headers
  one byte at a time gets no more than that). A TLS handshake has ``header_timeout``
  from the ``accept()`` to complete.
- busy: a request is being handled (the server marks it with ``request_started`` and
  ``request_finished``); no deadline of its own, the handler's limits apply. While a
  handler reads a body (``uploading``), the connection also notes since when.

With a ``write_timeout`` (None: none), whatever the state, a connection whose client
stops reading is *stalled*: the transport holds more than its high-water mark (64 KiB)
of answer that the client has not taken. Closed (aborted: the unsent bytes cannot go
anyway) after ``write_timeout`` of that; any byte the client reads that brings the
buffer back under the low-water mark restarts the clock.

At ``max_connections``, a new connection makes room by closing the oldest connection
that is not busy, so a well-behaved client still gets in while idle or slow clients
hold every slot. If every connection is busy, the one that has been uploading its body
or stalled on its answer longest is cut instead: an upload's handler sees ``cut``,
answers and closes it, a stalled one is aborted. Only when every connection is busy
and none is uploading or stalled is the new one answered ``refusal`` (a 503) and closed
(a TLS one is only closed, since no handshake was made to answer it). The cap also
keeps the server below the process's file descriptor limit, where ``accept()`` itself
would start to fail: ``fit_to_descriptors`` sizes it with the listen backlog, since
asyncio accepts sockets a backlog at a time before any of them reaches the guard.

Shutdown uses the same bookkeeping: ``close_idle`` closes every connection that is
not busy, ``wait_until_idle`` returns as soon as no request is in flight.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
import resource
import ssl
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, cast

log = logging.getLogger(__name__)

# Connections the kernel queues for ``accept()``, and how many asyncio accepts in one go
# when a listening socket is readable: each takes a descriptor before the cap can shed
# anything. Between its accept() and the moment the cap has shed (and closed) an older
# connection for it, a socket waits through up to ``IN_TRANSIT_BATCHES`` turns of the
# event loop (accepted; transport made; admitted, an old one closed; that one's
# descriptor released), and each turn accepts another batch per listening socket; so
# that many backlogs are kept free under the descriptor limit, plus the server's own
# ``OWN_FDS`` (standard streams, listening sockets, epoll and its wake-up pipe,
# outgoing connections, the libraries' own: the exporter's forwarder and GPU library).
# Before, the exporter kept 64 free against aiohttp's backlog of 128, and bursts of new
# connections made ``accept()`` fail (465 times in 11 s). 32 keeps the reserve small
# enough that the default cap of 512 fits the usual limit of 1,024 with two listening
# sockets (``--listen :9420``: IPv4 and IPv6); the kernel makes clients beyond it wait
# (SYN retries), nothing fails.
LISTEN_BACKLOG: Final = 32
IN_TRANSIT_BATCHES: Final = 4
OWN_FDS: Final = 64
CLOSE_REASONS: Final = (
    "idle_timeout",
    "header_timeout",
    "write_timeout",
    "shed_at_cap",
    "refused_at_cap",
    "shutdown",
)
PLAIN_REFUSAL: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 27\r\n\r\ntoo many connections, retry"
)
# After an answer sent before its request's body was all in (408, 503, 413...): how long
# the rest is read and dropped before closing, so that the client can read the answer
# (closing with bytes unread sends a TCP reset, which can discard it). aiohttp's
# ``lingering_time``; also the bound on a cut upload's last answer and on a TLS
# connection's closing handshake.
LINGER_S: Final = 2.0

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
    write_timeout: float | None = None  # None: a client that does not read is not cut


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


def fit_to_descriptors(wanted: int, backlog: int, listeners: int) -> int:
    """``wanted`` connections, lowered if they, the sockets in transit through
    ``listeners`` listening sockets of ``backlog`` and ``OWN_FDS`` do not fit under the
    soft descriptor limit."""
    soft = _soft_fd_limit()
    reserve = OWN_FDS + IN_TRANSIT_BATCHES * backlog * listeners
    if soft is None or wanted + reserve <= soft:
        return wanted
    return max(1, soft - reserve)


class GuardedProtocol(asyncio.Protocol):
    """The protocol of one accepted socket: the guard's deadlines around ``inner``, the
    server's protocol; with ``tls``, the socket upgraded to TLS before ``inner`` starts.

    ``inner`` is what the server's requests know their connection by (aiohttp's
    ``request.protocol``); the guard's books are keyed by it (``handler``)."""

    def __init__(
        self,
        guard: ConnectionGuard,
        inner: asyncio.Protocol,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.guard = guard
        self.inner = inner
        self.handler: object = inner
        self.tls = tls
        self.admitted = False  # False: refused at the cap, ``inner`` never started
        self.started = False  # ``inner`` told of its transport (after the handshake)
        self._handshake: asyncio.Task[None] | None = None
        self.state = State.IDLE
        self.transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        # loop time at which the handler began reading a body; None while it is not
        self.uploading_since: float | None = None
        # loop time since which the client has not read its answer; None if it does
        # (or if the guard has no write timeout)
        self.stalled_since: float | None = None
        self.cut = asyncio.Event()  # set when the cap sheds this upload

    # --- asyncio.Protocol, forwarded --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, but not always an ``asyncio.Transport`` subclass: uvloop's
        # (which uvicorn takes when it is installed) is not, and an isinstance check
        # refused every connection of a worker on a GPU host that had it.
        self.transport = cast(asyncio.Transport, transport)
        transport = self.transport
        self.admitted = self.guard.admit(self)
        if not self.admitted:
            return
        if self.tls is None:
            self._start(transport)
        else:  # on the books from here; ``inner`` starts once the handshake is done
            self._handshake = asyncio.get_running_loop().create_task(
                self._secure(transport, self.tls)
            )

    async def _secure(self, plain: asyncio.Transport, context: ssl.SSLContext) -> None:
        """The TLS handshake, then ``inner`` on the TLS transport. While it runs the
        plain transport belongs to asyncio's TLS layer, and ``close`` closes that."""
        try:
            secured = await asyncio.get_running_loop().start_tls(
                plain,
                self,  # the decrypted side is served through this protocol, as before
                context,
                server_side=True,
                # a TLS client gets no longer for its handshake than for its headers
                ssl_handshake_timeout=self.guard.limits.header_timeout,
                ssl_shutdown_timeout=self.guard.linger_s,
            )
        except asyncio.CancelledError:
            self._gone(None)
            raise
        except Exception:  # a failed handshake (a scanner, a plain-HTTP client, too
            # slow): asyncio has closed the socket; not worth a log line
            self._gone(None)
            return
        if secured is None or secured.is_closing():  # closed (shed, shut down) meanwhile
            self._gone(None)
            return
        self.transport = secured
        self._start(secured)

    def _start(self, transport: asyncio.Transport) -> None:
        self.started = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.received(self.inner.data_received, data)

    def received(self, deliver: Callable[[Any], None], received: Any) -> None:
        """Hand what arrived to ``inner`` (``deliver(received)``), this connection the
        current one meanwhile; the first bytes of a request start its head's deadline."""
        if self.state is State.IDLE and not self.cut.is_set():  # a cut one only lingers
            self.state = State.HEAD
            self.set_deadline(self.guard.limits.header_timeout, "header_timeout")
        token = _current.set(self)
        try:
            deliver(received)
        finally:
            _current.reset(token)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone(exc)

    def _gone(self, exc: Exception | None) -> None:
        """Off the books, ``inner`` told (once); asyncio's TLS layer may report a failed
        handshake here as well as to ``_secure``."""
        self.cancel_deadline()
        self._cancel_stall()
        self.guard.closed(self)
        if self.started:
            self.started = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        write_timeout = self.guard.limits.write_timeout
        if write_timeout is not None:
            loop = asyncio.get_running_loop()
            self.stalled_since = loop.time()
            self._stall = loop.call_later(write_timeout, self.close, "write_timeout")
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
        self._deadline = asyncio.get_running_loop().call_later(seconds, self.close_now)

    def close(self, reason: str) -> None:
        """Close the connection now, counted under ``reason``."""
        if self.transport is not None and not self.transport.is_closing():
            self.guard.closed_by_reason[reason] += 1
            self.close_now()

    def close_now(self) -> None:
        """Close the connection now, uncounted."""
        assert self.transport is not None
        if self.transport.get_write_buffer_size():
            # A plain close would wait for the client to take what is buffered, which a
            # client that does not read never does: the descriptor would stay open.
            self.transport.abort()
        else:
            self.transport.close()


class ConnectionGuard:
    """The open connections of one server, oldest first, and what each is doing.

    ``refusal`` is what a connection refused at the cap is sent before it is closed
    (a complete HTTP/1.1 response); ``linger_s`` how long a cut upload may take to be
    answered; ``logger`` says when the cap is lowered. Listen with ``backlog``, and call
    ``listening_on`` with the number of listening sockets before accepting (one is
    assumed until then)."""

    def __init__(
        self,
        limits: ConnectionLimits,
        *,
        refusal: bytes = PLAIN_REFUSAL,
        linger_s: float = LINGER_S,
        logger: logging.Logger = log,
    ) -> None:
        self.limits = limits
        self.log = logger
        self.refusal = refusal
        self.linger_s = linger_s
        self.backlog = listen_backlog()
        # Fitted for one listening socket until ``listening_on`` says how many there are.
        self.max_connections = fit_to_descriptors(limits.max_connections, self.backlog, 1)
        reasons = [r for r in CLOSE_REASONS if r != "write_timeout" or limits.write_timeout]
        self.closed_by_reason: Counter[str] = Counter({reason: 0 for reason in reasons})
        # handler -> its connection, oldest first (dicts keep insertion order)
        self._open: dict[object, GuardedProtocol] = {}
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopping = False  # set by the server when it stops accepting
        # The TLS context new connections get from ``protocol_factory``; None serves
        # plain HTTP. Read at each accept, so a changed context applies to the next
        # connection.
        self.tls: ssl.SSLContext | None = None

    def listening_on(self, listeners: int) -> None:
        """Fit the cap to the descriptor limit for ``listeners`` listening sockets
        (before any connection is accepted); a warning says when it is lowered."""
        wanted = self.limits.max_connections
        fitted = fit_to_descriptors(wanted, self.backlog, listeners)
        if fitted != wanted:
            self.log.warning(
                "--max-connections %d does not fit the file descriptor limit %d; using %d",
                wanted, _soft_fd_limit(), fitted,
            )  # fmt: skip
        self.max_connections = fitted

    def protocol_factory(self, make_handler: Callable[[], Any]) -> Callable[[], GuardedProtocol]:
        """What a listener calls at each ``accept()``: the server's protocol from
        ``make_handler``, behind TLS when ``tls`` is set, behind the guard always."""

        def new_connection() -> GuardedProtocol:
            return GuardedProtocol(self, make_handler(), tls=self.tls)

        return new_connection

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
            if connection.tls is not None:  # TLS: no plaintext 503
                connection.transport.abort()
            else:
                connection.transport.write(self.refusal)
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
        aborted now; an upload's handler sees ``cut`` set, answers and closes it, within
        ``linger_s`` at the latest."""
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
            oldest.close_later(self.linger_s)
        else:
            oldest.close_now()
        return True

    # --- requests -------------------------------------------------------------------

    def request_started(self, handler: object) -> GuardedProtocol | None:
        """Mark the connection of ``handler`` busy; None if it is not open (closed, cut
        at the cap, not one of ours) or busy already."""
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
        """Around a handler's body read: marks the connection of ``handler`` as
        uploading, so that the cap may cut it; yields the event that says it was cut."""
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


def _first(*times: float | None) -> float | None:
    """The earliest of the times that are set."""
    present = [t for t in times if t is not None]
    return min(present) if present else None


class AcceptErrorLog:
    """A loop exception handler that logs ``accept()`` failures (out of file descriptors
    or memory) once per ``interval_s`` with a count, instead of a traceback per attempt;
    everything else goes to the handler that was there before. Logged to ``logger``."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        interval_s: float = 10.0,
        *,
        logger: logging.Logger = log,
    ) -> None:
        self.loop = loop
        self.log = logger
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
        self.log.error(
            "accepting connections fails: %s (%d more such failures since the last report; "
            "lower --max-connections or raise the file descriptor limit)",
            context.get("exception"), self.suppressed,
        )  # fmt: skip
        self._last, self.suppressed = now, 0
