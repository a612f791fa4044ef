"""The exporter's connections under ``gpuscope.connections``: the aiohttp wiring.

The guard itself (idle, header and write timeouts, the cap with its shedding, TLS
layered under it so that a handshake counts from its ``accept()``, the backlog and
descriptor reserve, ``accept()`` failures logged once per interval) is
``gpuscope.connections``, shared with the worker. Here: ``request_middleware`` marks a
connection busy while aiohttp handles its request (found by ``request.protocol``,
aiohttp's protocol, the handler the guard keys its books by); the guard's counts are
served by ``gpuscope.families.ConnectionCollector`` under the exporter's connection rows
(the worker's too, under its own rows); ``AcceptErrorLog`` and ``log`` keep the
exporter's name on its connection log lines.
``server.listen`` accepts through ``ConnectionGuard.protocol_factory``;
``handlers.receive_traces`` reads a body under ``ConnectionGuard.uploading``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from gpuscope import connections
from gpuscope.connections import ConnectionGuard

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
