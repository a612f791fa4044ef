"""Running the exporter: ``start_exporter`` (in-process, any port) and ``serve`` (until SIGTERM).

``start_exporter`` is what the demo and tests use::

    config = ExporterConfig(listen="127.0.0.1:0", gpu_source=GpuSourceKind.NONE)
    exporter = await start_exporter(config)
    ... send spans to exporter.url + "/v1/traces", scrape exporter.url + "/metrics" ...
    await exporter.stop()

While it runs, the web config and bearer token files are read again on SIGHUP and when
they change (``http.reload``); SIGUSR1 releases the GPU source (NVML) and SIGUSR2 takes
it again (``GpuPoller.release``).

Shutdown order: the listener's (``http.server.Listener.stop``: ``/readyz`` turns 503,
the listener closes, idle connections close, requests in flight get up to
``--shutdown-timeout-s``), then the forwarder drains its queue (same bound) and the
GPU poller thread is joined.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from gpuscope.exporter.app import create_app
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.source import ComputeObserver, GpuSource
from gpuscope.exporter.http.auth import AUTH
from gpuscope.exporter.http.connections import AcceptErrorLog
from gpuscope.exporter.http.reload import CredentialFiles
from gpuscope.exporter.http.security import WebConfig, load_web_config, read_bearer_token
from gpuscope.exporter.http.server import Listener, listen
from gpuscope.exporter.state import STATE

log = logging.getLogger(__name__)


@dataclass
class RunningExporter:
    """A started exporter: its app, its real port, and how to stop it."""

    app: web.Application
    listener: Listener
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
        self.watching.cancel()
        await self.listener.stop()


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
    tls = web_config.tls if web_config is not None else None
    listener = await listen(app, tls)
    bound_host, bound_port = listener.address
    credentials = CredentialFiles(app[STATE], app[AUTH])
    watching = asyncio.create_task(credentials.watch(), name="gpuscope-credential-files")
    return RunningExporter(
        app, listener, bound_host, bound_port, tls is not None, credentials, watching
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
