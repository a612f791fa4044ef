"""Running the exporter: ``start_exporter`` (in-process, any port) and ``serve`` (until SIGTERM).

``start_exporter`` is what the demo and tests use::

    config = ExporterConfig(listen="127.0.0.1:0", gpu_source=GpuSourceKind.NONE)
    exporter = await start_exporter(config)
    ... send spans to exporter.url + "/v1/traces", scrape exporter.url + "/metrics" ...
    await exporter.stop()

While it runs, the web config and bearer token files are read again on SIGHUP and when
they change (``reload``); SIGUSR1 releases the GPU source (NVML) and SIGUSR2 takes it
again (``GpuPoller.release``).

Shutdown order: ``/readyz`` turns 503 and the listener closes; connections without
a request in flight are closed; requests in flight (bodies still uploading included)
get up to ``--shutdown-timeout-s`` seconds, and a body not all in by then is answered
503; the exporter goes on as soon as nothing is in flight, so an idle exporter stops
at once. Then the forwarder drains its queue (same bound) and the GPU poller thread
is joined.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from gpuscope.connections import LINGER_S, ConnectionGuard
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.source import ComputeObserver, GpuSource
from gpuscope.exporter.http.app import create_app
from gpuscope.exporter.http.connections import AcceptErrorLog
from gpuscope.exporter.http.reload import CredentialFiles
from gpuscope.exporter.http.security import WebConfig, load_web_config, read_bearer_token
from gpuscope.exporter.state import STATE

log = logging.getLogger(__name__)

# After the shutdown timeout: how long the 503s to late uploads may take to go out.
LAST_ANSWERS_S = 1.0


@dataclass
class RunningExporter:
    """A started exporter: its app, its real port, and how to stop it."""

    app: web.Application
    runner: web.AppRunner
    host: str
    port: int
    tls: bool
    credentials: CredentialFiles  # its web config and bearer token files, watched
    watching: asyncio.Task[None]

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123`` (the host as bound; 0.0.0.0 when all)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop in the documented order; returns as soon as nothing is in flight."""
        state = self.app[STATE]
        state.stopping = state.guard.stopping = True
        self.watching.cancel()
        for site in list(self.runner.sites):
            await site.stop()  # stop listening; open connections stay
        state.guard.close_idle()
        if not await state.guard.wait_until_idle(state.config.shutdown_timeout_s):
            state.drain_expired.set()  # late uploads are answered 503
            await state.guard.wait_until_idle(LAST_ANSWERS_S)
        await self.runner.cleanup()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through a ``ConnectionGuard``."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str | None,
        port: int,
        guard: ConnectionGuard,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        return (
            f"{'https' if self._ssl_context else 'http'}://{self._host or '0.0.0.0'}:{self._port}"
        )

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # TLS is layered by the guard's protocols, not by asyncio, so that a connection
        # is counted (and can be shed) from its accept(), its handshake included.
        self._guard.tls = self._ssl_context
        self._server = await loop.create_server(
            self._guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._guard.backlog,
        )
        # Nothing is accepted before this coroutine yields to the event loop.
        self._guard.listening_on(len(self._server.sockets))


async def start_exporter(
    config: ExporterConfig,
    *,
    gpu_source: GpuSource | None = None,
    compute_observers: Sequence[ComputeObserver] = (),
    web_config: WebConfig | None = None,
    bearer_token: str | None = None,
) -> RunningExporter:
    """Build and start the exporter on ``config.listen``; returns once it accepts requests.

    The web config and bearer token are read from the files named in ``config``
    unless given here. ``gpu_source`` is owned (and closed) by the exporter.
    """
    if web_config is None and config.web_config_file is not None:
        web_config = load_web_config(config.web_config_file)
    if bearer_token is None and config.bearer_token_file is not None:
        bearer_token = read_bearer_token(config.bearer_token_file)
    app = create_app(
        config,
        gpu_source=gpu_source,
        compute_observers=compute_observers,
        web_config=web_config,
        bearer_token=bearer_token,
    )
    runner = web.AppRunner(
        app,
        auto_decompress=False,  # the handler inflates gzip itself, with a limit
        # ``RunningExporter.stop`` has drained by the time aiohttp's own shutdown runs
        shutdown_timeout=LAST_ANSWERS_S,
        # a backstop only: the guard's idle and header timeouts close connections first
        keepalive_timeout=config.idle_timeout_s + config.header_timeout_s,
        lingering_time=LINGER_S,
        access_log=None,
    )
    await runner.setup()
    host, port = config.listen_address()
    tls = web_config.tls if web_config is not None else None
    site = GuardedSite(runner, host, port, app[STATE].guard, tls)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    credentials = CredentialFiles(app[STATE])
    watching = asyncio.create_task(credentials.watch(), name="gpuscope-credential-files")
    return RunningExporter(
        app, runner, str(bound_host), int(bound_port), tls is not None, credentials, watching
    )


async def serve(
    config: ExporterConfig,
    *,
    gpu_source: GpuSource | None = None,
    compute_observers: Sequence[ComputeObserver] = (),
    web_config: WebConfig | None = None,
    bearer_token: str | None = None,
) -> None:
    """Run until SIGTERM or SIGINT, then shut down in the documented order. SIGHUP reads
    the web config and bearer token files again (see ``reload``); it never stops."""
    stop = asyncio.Event()
    reread = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)  # the handler only sets a flag
    loop.add_signal_handler(signal.SIGHUP, reread.set)  # before start: never the default
    release, acquire = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, release.set)  # NVML released, until SIGUSR2
    loop.add_signal_handler(signal.SIGUSR2, acquire.set)
    try:
        exporter = await start_exporter(
            config,
            gpu_source=gpu_source,
            compute_observers=compute_observers,
            web_config=web_config,
            bearer_token=bearer_token,
        )
        log.info("serving on %s", exporter.url)
        rereading = asyncio.create_task(_reread_on(reread, exporter), name="gpuscope-sighup")
        switching = asyncio.create_task(
            _release_on(release, acquire, exporter), name="gpuscope-usr"
        )
        try:
            with AcceptErrorLog(loop):
                await stop.wait()
            log.info("shutting down")
        finally:
            rereading.cancel()
            switching.cancel()
            await exporter.stop()
    finally:
        for signum in (
            signal.SIGTERM,
            signal.SIGINT,
            signal.SIGHUP,
            signal.SIGUSR1,
            signal.SIGUSR2,
        ):
            loop.remove_signal_handler(signum)


async def _reread_on(signalled: asyncio.Event, exporter: RunningExporter) -> None:
    while True:
        await signalled.wait()
        signalled.clear()
        await exporter.credentials.reload("SIGHUP")


async def _release_on(
    release: asyncio.Event, acquire: asyncio.Event, exporter: RunningExporter
) -> None:
    """SIGUSR1 lets go of the GPU source (NVML) until SIGUSR2 (see docs/gpu.md)."""
    while True:
        waits = {asyncio.ensure_future(e.wait()): e for e in (release, acquire)}
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        poller = exporter.app[STATE].poller
        for task in done:
            signalled = waits[task]
            signalled.clear()
            if poller is None:
                log.info("no GPU source to release or take again")
            elif signalled is release:
                poller.release()
            else:
                poller.acquire()
