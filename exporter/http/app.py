"""``web_app``: the exporter's aiohttp application around parts built elsewhere.

Routes, the middlewares (connection tracking, then authentication), the ``Server``
header and the connection families; the parts (aggregator, ingest, poller, forwarder)
come in an ``ExporterState`` from the composition root, ``gpuscope.exporter.app``.

Serve the app with ``auto_decompress=False`` on the runner (``server.listen`` does):
the handler inflates gzip bodies itself, with a size limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import hdrs, web

from gpuscope.contract import exporter as rows
from gpuscope.contract.http import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH, TRACES_PATH
from gpuscope.exporter.http.auth import AUTH, AuthState, auth_middleware
from gpuscope.exporter.http.connections import request_middleware
from gpuscope.exporter.http.handlers import (
    expect_traces_body,
    healthz,
    readyz,
    receive_traces,
    serve_metrics,
)
from gpuscope.exporter.state import STATE, ExporterState
from gpuscope.families import ConnectionCollector


def web_app(state: ExporterState, auth: AuthState) -> web.Application:
    """The app serving ``state``, checking requests against ``auth``; the password
    check pool closes with the app."""
    state.registry.register(ConnectionCollector(state.guard, rows.CONNECTION_METRICS))
    # Connection tracking first, so that refused requests count as in flight too. The
    # auth middleware is there even without credentials: a reload may bring some.
    middlewares = [request_middleware(state.guard), auth_middleware(state, auth)]
    app = web.Application(client_max_size=state.config.max_body_bytes, middlewares=middlewares)
    app[STATE] = state
    app[AUTH] = auth
    app.on_response_prepare.append(_server_header)
    app.router.add_post(TRACES_PATH, receive_traces, expect_handler=expect_traces_body)
    app.router.add_get(METRICS_PATH, serve_metrics)
    app.router.add_get(HEALTHZ_PATH, healthz)
    app.router.add_get(READYZ_PATH, readyz)
    app.cleanup_ctx.append(_password_checks)
    return app


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    """Name the server without versions: aiohttp's default ``Python/3.x aiohttp/3.x``
    tells anyone, without credentials (the probes need none), which known bugs apply.
    aiohttp only sets its default where the header is still unset after this hook."""
    response.headers[hdrs.SERVER] = "gpuscope"


async def _password_checks(app: web.Application) -> AsyncIterator[None]:
    yield
    app[AUTH].password_checks.close()
