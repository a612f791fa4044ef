"""Running the exporter: ``start_exporter`` (in-process, any port) and ``serve`` (until SIGTERM).

``start_exporter`` is what the demo and tests use::

    config = ExporterConfig(listen="127.0.0.1:0", gpu_source="none")
    exporter = await start_exporter(config)
    ... send spans to exporter.url + "/v1/traces", scrape exporter.url + "/metrics" ...
    await exporter.stop()

Shutdown order: ``/readyz`` turns 503, the listener closes, in-flight requests get
up to ``--shutdown-timeout-s`` seconds, then the forwarder drains its queue (same
bound) and the GPU poller thread is joined.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from aiohttp import web

from gpuscope.exporter.app import STATE, create_app
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.source import GpuSource
from gpuscope.exporter.security import WebConfig, load_web_config, read_bearer_token

log = logging.getLogger(__name__)


@dataclass
class RunningExporter:
    """A started exporter: its app, its real port, and how to stop it."""

    app: web.Application
    runner: web.AppRunner
    host: str
    port: int
    tls: bool

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123`` (the host as bound; 0.0.0.0 when all)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def stop(self) -> None:
        self.app[STATE].stopping = True
        await self.runner.cleanup()


async def start_exporter(
    config: ExporterConfig,
    *,
    gpu_source: GpuSource | None = None,
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
        config, gpu_source=gpu_source, web_config=web_config, bearer_token=bearer_token
    )
    runner = web.AppRunner(
        app,
        auto_decompress=False,  # the handler inflates gzip itself, with a limit
        shutdown_timeout=config.shutdown_timeout,
        access_log=None,
    )
    await runner.setup()
    host, port = config.listen_address()
    tls = web_config.tls if web_config is not None else None
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return RunningExporter(app, runner, str(bound_host), int(bound_port), tls is not None)


async def serve(
    config: ExporterConfig,
    *,
    gpu_source: GpuSource | None = None,
    web_config: WebConfig | None = None,
    bearer_token: str | None = None,
) -> None:
    """Run until SIGTERM or SIGINT, then shut down in the documented order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)  # the handler only sets a flag
    try:
        exporter = await start_exporter(
            config, gpu_source=gpu_source, web_config=web_config, bearer_token=bearer_token
        )
        log.info("serving on %s", exporter.url)
        try:
            await stop.wait()
            log.info("shutting down")
        finally:
            await exporter.stop()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
