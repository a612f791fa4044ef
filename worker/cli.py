"""``gpuscope worker``: parse the configuration once, wire tracing, serve with uvicorn.

Shutdown order on SIGINT/SIGTERM (uvicorn's, then the app's lifespan): stop
accepting connections, let open requests finish for ``--shutdown-timeout-s``,
then the schedulers cancel what is left, and the tracer provider flushes its spans
within another ``--shutdown-timeout-s`` (what it cannot deliver by then is dropped
and counted).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import uvicorn

from gpuscope.worker.config import ConfigError, parse_config


def main(argv: list[str]) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"gpuscope worker: {exc}", file=sys.stderr)
        return 2
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
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        timeout_graceful_shutdown=max(1, round(config.shutdown_timeout_s)),
        lifespan="on",
    )
    return 0
