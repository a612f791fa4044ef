"""The exporter's connections under ``gpuscope.connections``: the aiohttp wiring and the
``gpuscope_http_connections*`` families.

The guard itself (idle, header and write timeouts, the cap with its shedding, TLS
layered under it so that a handshake counts from its ``accept()``, the backlog and
descriptor reserve, ``accept()`` failures logged once per interval) is
``gpuscope.connections``, shared with the worker. Here: ``request_middleware`` marks a
connection busy while aiohttp handles its request (found by ``request.protocol``,
aiohttp's protocol, the handler the guard keys its books by), and
``ConnectionCollector`` serves the guard's counts under the exporter's metric names;
``AcceptErrorLog`` and ``log`` keep the exporter's name on its connection log lines.
``server.listen`` accepts through ``ConnectionGuard.protocol_factory``;
``handlers.receive_traces`` reads a body under ``ConnectionGuard.uploading``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import hdrs, web
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuscope import connections
from gpuscope.connections import ConnectionGuard
from gpuscope.exporter.definitions import (
    HTTP_CONNECTIONS,
    HTTP_CONNECTIONS_CLOSED,
    HTTP_CONNECTIONS_MAX,
)

# The exporter's connection log lines (the cap lowered, ``accept()`` failing) carry this
# module's name, as they did before the guard moved to ``gpuscope.connections``.
log = logging.getLogger(__name__)


class AcceptErrorLog(connections.AcceptErrorLog):
    """``gpuscope.connections.AcceptErrorLog``, logging under the exporter's name."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = 10.0) -> None:
        super().__init__(loop, interval_s, logger=log)


def request_middleware(guard: ConnectionGuard) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Marks each connection busy while its request is handled; while the server is
    stopping, responses close their connection."""

    @web.middleware
    async def track_request(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        connection = guard.request_started(request.protocol)
        try:
            response = await handler(request)
        finally:
            if connection is not None:
                guard.request_finished(connection)
        if guard.stopping:
            response.force_close()
            response.headers[hdrs.CONNECTION] = "close"
        return response

    return track_request


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
