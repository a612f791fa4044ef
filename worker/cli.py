"""``gpuscope worker``: parse the configuration once, wire tracing, serve with uvicorn.

Shutdown order on SIGTERM/SIGINT: the listening socket stays open while the app
drains (new requests get 503, ``/readyz`` and ``/health`` answer 503), requests
already admitted get ``--shutdown-timeout-s`` to finish, and what is left is ended
with 503 (or an error event on a stream). Only then does uvicorn stop accepting
connections and close them; the device thread is joined, the tracer provider
flushes its spans within another ``--shutdown-timeout-s`` (what it cannot deliver
by then is dropped and counted), and the command exits 0. A second signal skips
what is left of the drain.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from gpuscope import flags
from gpuscope.connections import AcceptErrorLog
from gpuscope.worker.config import ConfigError, WorkerConfig
from gpuscope.worker.connections import http_protocol

if TYPE_CHECKING:
    from gpuscope.worker.app import WorkerApp

logger = logging.getLogger("gpuscope.worker")


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first SIGTERM/SIGINT drains the app before it stops.

    uvicorn's own handling closes the socket at once and, past its timeout, cancels
    what still runs (a 500 and a traceback), then re-raises the signal (exit 143).
    """

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        with AcceptErrorLog(self._loop):  # out of descriptors: a line per 10 s, not a flood
            await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: only hand the work to the event loop.
        if self._loop is None or self._draining is not None:
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._draining is None:
            logger.info("draining: new requests get 503, running ones may finish")
            self._draining = asyncio.get_running_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain()
        finally:
            self.should_exit = True


def serve(config: WorkerConfig, app: WorkerApp) -> None:
    """Serve ``app`` on ``config.host:config.port`` until a signal has drained it, every
    connection under the limits of ``app.listener``."""
    listener = app.listener
    listener.listening_on(config.host, config.port)
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            # After the drain only finished answers are still being written.
            timeout_graceful_shutdown=max(1, round(config.shutdown_timeout_s)),
            lifespan="on",
            # asyncio's loop, also where uvloop is installed (uvicorn's "auto" takes it):
            # the guard's handling of failed accept() calls, and its tests, are asyncio's.
            loop="asyncio",
            http=http_protocol(listener.guard),
            backlog=listener.backlog,
            # A backstop only: the guard's idle timeout closes (and counts) first.
            timeout_keep_alive=math.ceil(config.idle_timeout_s) + 1,
        ),
        app.drain,
    )
    server.run()


def why_unbindable(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on right now, or None when it can.

    uvicorn finds out only after the models are built, and says so in half a dozen
    log lines; asking first gives one line and no wasted start-up."""
    if port == 0:
        return None
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.create_server((host, port), family=family):
            return None
    except socket.gaierror as exc:
        return str(exc.strerror)
    except OSError as exc:  # create_server's own text repeats the address
        return os.strerror(exc.errno) if exc.errno else str(exc)


def main(argv: list[str]) -> int:
    config = flags.parse(WorkerConfig, argv)
    problem = why_unbindable(config.host, config.port)
    if problem is not None:
        print(
            f"gpuscope worker: cannot serve on {config.host}:{config.port}: {problem}",
            file=sys.stderr,
        )
        return 1
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from opentelemetry import trace

    from gpuscope.middleware import setup_tracing
    from gpuscope.worker.app import create_app

    provider: trace.TracerProvider = trace.NoOpTracerProvider()
    flush: Callable[[], None] | None = None
    if not config.no_tracing:
        # The span flush at exit gets the same budget as the requests in flight.
        sdk_provider = setup_tracing(
            config.otlp_endpoint,
            config.service_name,
            shutdown_timeout_s=config.shutdown_timeout_s,
            set_global=False,
        )
        provider, flush = sdk_provider, sdk_provider.shutdown
    try:
        app = create_app(config, tracer_provider=provider, on_shutdown=flush)
    except ConfigError as exc:
        print(f"gpuscope worker: {exc}", file=sys.stderr)
        return 2
    serve(config, app)
    return 0
