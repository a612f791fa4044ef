"""``gpuscope exporter``: parse the config once, open the GPU source, serve until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from gpuscope import flags
from gpuscope.exporter.config import ConfigError, ExporterConfig
from gpuscope.exporter.gpu.source import ComputeObserver
from gpuscope.exporter.http.security import load_web_config, read_bearer_token
from gpuscope.exporter.service import serve

log = logging.getLogger("gpuscope.exporter")


def main(argv: list[str]) -> int:
    config = flags.parse(ExporterConfig, argv)
    try:
        # Read before the GPU is opened, so that a bad file costs nothing to undo.
        web_config = load_web_config(config.web_config_file) if config.web_config_file else None
        token = read_bearer_token(config.bearer_token_file) if config.bearer_token_file else None
    except ConfigError as exc:
        print(f"gpuscope exporter: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Imported here: opening NVML is the GPU package's business, and only this
    # command (not the tests that inject fakes) needs it.
    from gpuscope.exporter.gpu.factory import GpuSourceUnavailable, open_gpu_source

    try:
        source = open_gpu_source(
            config.gpu_source,
            scenario=config.gpu_scenario,
            simulated_count=config.simulated_gpus,
            require=config.require_gpu,
        )
    except ValueError as exc:  # the message names the flag
        print(f"gpuscope exporter: {exc}", file=sys.stderr)
        return 2
    except GpuSourceUnavailable as exc:
        print(f"gpuscope exporter: {exc}", file=sys.stderr)
        return 1
    log.info("GPU source: %s", source.name if source is not None else "none")
    # a source that follows the batches it is told of (the simulated one) hears of them
    observers: list[ComputeObserver] = [source] if isinstance(source, ComputeObserver) else []
    try:
        asyncio.run(
            serve(
                config,
                gpu_source=source,
                compute_observers=observers,
                web_config=web_config,
                bearer_token=token,
            )
        )
    except OSError as exc:  # address in use, TLS files unreadable at bind time
        # asyncio's message repeats the address; the errno's text says it once.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        print(f"gpuscope exporter: cannot serve on {config.listen}: {reason}", file=sys.stderr)
        return 1
    return 0
