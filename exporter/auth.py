"""The exporter's authentication middleware: bearer token on ``/v1/traces``, basic auth.

What is checked comes from ``security.Authenticator``; this module only applies it to
requests. A refused OTLP export is answered in OTLP's own error format and counted as
``gpuscope_otlp_requests_rejected_total{reason="unauthorized"}``; a refused scrape gets
a plain 401 with a basic-auth challenge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from gpuscope.exporter import otlp
from gpuscope.exporter.handlers import TRACES_PATH, ExporterState, otlp_error
from gpuscope.exporter.security import Authenticator


def needs_auth(authenticator: Authenticator) -> bool:
    return bool(authenticator.users) or authenticator.bearer_token is not None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(state: ExporterState) -> Middleware:
    auth = state.authenticator

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get(hdrs.AUTHORIZATION)
        is_traces = request.path == TRACES_PATH
        if is_traces and auth.bearer_token is not None:
            if auth.bearer_ok(header):
                return await handler(request)
            return _unauthorized(state, request, "a valid bearer token is required")
        if auth.users:
            credentials = auth.basic_credentials(header)
            if credentials is None or not (
                auth.cached(*credentials) or await asyncio.to_thread(auth.verify, *credentials)
            ):
                return _unauthorized(state, request, "valid basic auth credentials are required")
        return await handler(request)

    return authenticate


def _unauthorized(state: ExporterState, request: web.Request, message: str) -> web.Response:
    if request.path != TRACES_PATH:
        return web.Response(
            status=401,
            text=message + "\n",
            headers={hdrs.WWW_AUTHENTICATE: 'Basic realm="gpuscope"'},
        )
    state.metrics.requests_rejected[otlp.UNAUTHORIZED] += 1
    media = otlp.JSON if request.content_type == otlp.JSON else otlp.PROTOBUF
    response = otlp_error(media, 401, message)
    scheme = "Bearer" if state.authenticator.bearer_token is not None else 'Basic realm="gpuscope"'
    response.headers[hdrs.WWW_AUTHENTICATE] = scheme
    return response
