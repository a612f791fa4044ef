"""The exporter's authentication middleware: bearer token on ``/v1/traces``, basic auth.

What is checked comes from ``security.Authenticator``; this module only applies it to
requests. A refused OTLP export is answered in OTLP's own error format and counted as
``gpuscope_otlp_requests_rejected_total{reason="unauthorized"}``; a refused scrape gets
a plain 401 with a basic-auth challenge. The probes ``/healthz`` and ``/readyz`` answer
without credentials: a kubelet's HTTP probe cannot send them, and the probes tell
nothing but that the exporter serves and is ready. A request whose credentials were
checked is marked (``was_authenticated``): the process join trusts the pid claims of
authenticated senders only, where that is required.

bcrypt checks run in a pool of their own (``password_check_pool``): two threads, and
at most ``PASSWORD_CHECKS_PENDING`` checks running or waiting. Past that a request
that needs a check is answered 503 with ``Retry-After`` at once (``auth_busy`` when it
is an OTLP export), so a flood of wrong passwords costs two cores' worth of bcrypt at
most and never delays a scrape's render, which runs in other threads. A password
already verified (``Authenticator.cached``) needs no check and is never refused so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from gpuscope.contract import http as http_paths
from gpuscope.contract.http import TRACES_PATH
from gpuscope.exporter.http.routes import otlp_error
from gpuscope.exporter.http.security import Authenticator
from gpuscope.exporter.ingest import otlp
from gpuscope.exporter.state import ExporterState
from gpuscope.exporter.threads import Busy, ThreadPool

# bcrypt releases the GIL: two threads use two cores, the most a check flood may take.
PASSWORD_CHECK_THREADS: Final = 2
# Room for a burst of honest first scrapes (each ~50-200 ms at cost 10-12) behind the
# running checks, with the wait bounded to about a second.
PASSWORD_CHECKS_PENDING: Final = 16
RETRY_AFTER_S: Final = "1"
PROBE_PATHS: Final = frozenset(http_paths.PROBE_PATHS)
_AUTHENTICATED: Final = web.RequestKey("gpuscope_authenticated", bool)  # credentials checked


def was_authenticated(request: web.Request) -> bool:
    """Whether the auth middleware checked this request's credentials and took them."""
    return request.get(_AUTHENTICATED, False) is True


def password_check_pool() -> ThreadPool:
    return ThreadPool("gpuscope-bcrypt", PASSWORD_CHECK_THREADS, PASSWORD_CHECKS_PENDING)


@dataclass
class AuthState:
    """The credentials requests are checked against (replaced whole by a reload) and
    the pool the password checks run in; one per app, ``request.app[AUTH]``."""

    authenticator: Authenticator
    password_checks: ThreadPool = field(default_factory=password_check_pool)


AUTH = web.AppKey("gpuscope_exporter_auth", AuthState)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(state: ExporterState, credentials: AuthState) -> Middleware:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBE_PATHS:
            return await handler(request)
        auth = credentials.authenticator
        header = request.headers.get(hdrs.AUTHORIZATION)
        is_traces = request.path == TRACES_PATH
        if is_traces and auth.bearer_token is not None:
            if auth.bearer_ok(header):
                request[_AUTHENTICATED] = True
                return await handler(request)
            return _unauthorized(state, auth, request, "a valid bearer token is required")
        if auth.users:
            given = auth.basic_credentials(header)
            if given is None:
                return _unauthorized(
                    state, auth, request, "valid basic auth credentials are required"
                )
            if not auth.cached(*given):
                try:
                    check = credentials.password_checks.submit(partial(auth.verify, *given))
                except Busy:
                    return _busy(state, request)
                if not await check:
                    return _unauthorized(
                        state, auth, request, "valid basic auth credentials are required"
                    )
            request[_AUTHENTICATED] = True
        return await handler(request)

    return authenticate


def _unauthorized(
    state: ExporterState, auth: Authenticator, request: web.Request, message: str
) -> web.Response:
    if request.path != TRACES_PATH:
        return web.Response(
            status=401,
            text=message + "\n",
            headers={hdrs.WWW_AUTHENTICATE: 'Basic realm="gpuscope"'},
        )
    state.metrics.requests_rejected[otlp.UNAUTHORIZED] += 1
    media = otlp.JSON if request.content_type == otlp.JSON else otlp.PROTOBUF
    response = otlp_error(media, 401, message)
    scheme = "Bearer" if auth.bearer_token is not None else 'Basic realm="gpuscope"'
    response.headers[hdrs.WWW_AUTHENTICATE] = scheme
    return response


def _busy(state: ExporterState, request: web.Request) -> web.Response:
    message = "too many password checks in progress; retry"
    if request.path != TRACES_PATH:
        response = web.Response(status=503, text=message + "\n")
    else:
        state.metrics.requests_rejected[otlp.AUTH_BUSY] += 1
        media = otlp.JSON if request.content_type == otlp.JSON else otlp.PROTOBUF
        response = otlp_error(media, 503, message)
    response.headers[hdrs.RETRY_AFTER] = RETRY_AFTER_S
    return response
