"""The worker's connections under ``gpuscope.connections``: idle and header timeouts, a
cap with shedding, through uvicorn.

uvicorn has a keep-alive timeout only after a response, no deadline for a request
head, and no cap that makes room: silent or trickling clients could hold every file
descriptor until ``accept()`` failed and ``/healthz`` went unanswered. Here each
connection's uvicorn protocol is wrapped in a ``GuardedProtocol`` (``http_protocol``,
given to uvicorn as its ``http`` class), and ``ConnectionTracking`` marks the
connection busy from the start of its request's ASGI call to its end: the guard's
``current_connection()`` finds it, since uvicorn starts that call's task while the
guarded protocol hands it the request's bytes.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any, Final

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuscope.connections import (
    ConnectionGuard,
    ConnectionLimits,
    GuardedProtocol,
    current_connection,
)
from gpuscope.worker.protocol import error_body

_BODY: Final = json.dumps(
    error_body(
        "too many connections to this worker, every one handling a request; retry",
        kind="server_error",
        code="too_many_connections",
    ),
    separators=(",", ":"),
).encode()
REFUSAL: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)


class Listener:
    """The guard of the worker's connections; its socket listens with ``backlog``."""

    def __init__(self, max_connections: int, header_timeout_s: float, idle_timeout_s: float):
        self.guard = ConnectionGuard(
            ConnectionLimits(max_connections, header_timeout_s, idle_timeout_s), refusal=REFUSAL
        )

    def listening_on(self, host: str, port: int) -> None:
        """Fit the cap for the sockets uvicorn will listen on: one per address ``host``
        resolves to, as asyncio's ``create_server`` makes them."""
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError:
            return  # uvicorn says why it cannot listen; the cap stays fitted for one
        self.guard.listening_on(max(1, len({address for *_, address in found})))

    @property
    def backlog(self) -> int:
        return self.guard.backlog


class ConnectionTracking:
    """ASGI: the connection of each HTTP request is busy while the app handles it.

    Counted per connection: uvicorn starts a pipelined request's task as the previous
    answer's last byte is sent, which may be before that request's app call returns,
    and the connection must stay busy until both have."""

    def __init__(self, app: ASGIApp, guard: ConnectionGuard) -> None:
        self.app = app
        self.guard = guard
        self._requests: dict[GuardedProtocol, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = self._enter() if scope["type"] == "http" else None
        try:
            await self.app(scope, receive, send)
        finally:
            if connection is not None:
                self._leave(connection)

    def _enter(self) -> GuardedProtocol | None:
        found = current_connection()
        if found is None or found.guard is not self.guard:
            return None  # not served through the guarded protocol (a test's own server)
        count = self._requests.get(found, 0)
        if count == 0 and self.guard.request_started(found.handler) is None:
            return None  # already closed, or shed at the cap
        self._requests[found] = count + 1
        return found

    def _leave(self, connection: GuardedProtocol) -> None:
        count = self._requests.pop(connection) - 1
        if count:
            self._requests[connection] = count
        else:
            self.guard.request_finished(connection)


def http_protocol(guard: ConnectionGuard, http: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's ``http`` protocol class, each connection wrapped for ``guard``."""
    inner_class: Any = uvicorn_protocol(http)

    class Guarded(GuardedProtocol):
        # uvicorn passes its config, server state and (in recent versions) loop by keyword
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(guard, inner_class(**kwargs))

    return Guarded


def uvicorn_protocol(http: str) -> type[asyncio.Protocol]:
    """The protocol class uvicorn serves ``--http`` ``http`` with (``auto``, ``h11``,
    ``httptools``, ``module:Class``), found the way uvicorn finds it: a ``Config`` of its
    own, loaded, read from its ``http_protocol_class``. Through uvicorn's public
    ``Config`` rather than its name table and importer, which are internals that a minor
    release may move. Nothing is started: no lifespan, no websockets, no logging set up."""
    config = uvicorn.Config(
        _unused_app, http=http, ws="none", lifespan="off", interface="asgi3", log_config=None
    )
    config.load()
    return config.http_protocol_class


async def _unused_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The app of the ``Config`` that only names a protocol class; never called."""
