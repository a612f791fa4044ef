"""``ExporterConfig``: every flag of ``gpuscope exporter``, parsed once from argv and environment.

Each flag ``--some-flag`` has the environment twin ``GPUSCOPE_SOME_FLAG``; a flag on
the command line wins over its twin. Validation errors name the flag.

``--listen :9420`` (the default) binds every interface, as Prometheus exporters do,
so that a scraper in another container or host can reach it; ``127.0.0.1:9420``
keeps it on loopback.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from gpuscope import flags
from gpuscope.exporter.gpu.source import GpuSourceKind
from gpuscope.flags import LOG_LEVELS, ConfigError, check_choice, check_positive, check_range

__all__ = ["ConfigError", "ExporterConfig", "build_parser", "parse_config"]

MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class ExporterConfig:
    listen: str = ":9420"
    max_series: int = 2000
    max_label_length: int = 128
    max_body_bytes: int = 8 * MIB
    max_decompressed_bytes: int = 20 * MIB
    max_spans_per_request: int = 100_000
    max_attributes_per_request: int = 1_000_000
    max_json_values_per_request: int = 1_000_000
    forward_otlp: str | None = None
    forward_queue: int = 256
    forward_queue_bytes: int = 64 * MIB
    forward_timeout: float = flags.option(
        10.0, flag="--forward-timeout-s", deprecated=("--forward-timeout",)
    )
    web_config_file: Path | None = None
    bearer_token_file: Path | None = None
    gpu_source: GpuSourceKind = GpuSourceKind.AUTO
    gpu_interval: float = flags.option(1.0, flag="--gpu-interval-s", deprecated=("--gpu-interval",))
    gpu_scenario: Path | None = None
    simulated_gpus: int = 1
    require_gpu: bool = False
    max_connections: int = 512
    header_timeout: float = flags.option(10.0, flag="--header-timeout-s")
    idle_timeout: float = flags.option(60.0, flag="--idle-timeout-s")
    body_timeout: float = flags.option(30.0, flag="--body-timeout-s")
    write_timeout: float = flags.option(30.0, flag="--write-timeout-s")
    shutdown_timeout: float = flags.option(
        10.0, flag="--shutdown-timeout-s", deprecated=("--shutdown-timeout",)
    )
    log_level: str = "info"

    def __post_init__(self) -> None:
        self.listen_address()  # raises with the flag's name
        object.__setattr__(self, "gpu_source", gpu_source_kind(self.gpu_source))
        check_choice("--log-level", self.log_level, LOG_LEVELS)
        if self.require_gpu and self.gpu_source == GpuSourceKind.NONE:
            raise ConfigError("--require-gpu: --gpu-source none opens no GPU")
        for flag, value, low in (
            ("--max-series", self.max_series, 1),
            ("--max-label-length", self.max_label_length, 1),
            ("--max-body-bytes", self.max_body_bytes, 1),
            ("--max-decompressed-bytes", self.max_decompressed_bytes, 1),
            ("--max-spans-per-request", self.max_spans_per_request, 1),
            ("--max-attributes-per-request", self.max_attributes_per_request, 1),
            ("--max-json-values-per-request", self.max_json_values_per_request, 1),
            ("--forward-queue", self.forward_queue, 1),
            ("--forward-queue-bytes", self.forward_queue_bytes, 1),
            ("--simulated-gpus", self.simulated_gpus, 1),
            ("--max-connections", self.max_connections, 1),
        ):
            check_range(flag, value, low)
        for flag, seconds in (
            ("--gpu-interval-s", self.gpu_interval),
            ("--forward-timeout-s", self.forward_timeout),
            ("--shutdown-timeout-s", self.shutdown_timeout),
            ("--header-timeout-s", self.header_timeout),
            ("--idle-timeout-s", self.idle_timeout),
            ("--body-timeout-s", self.body_timeout),
            ("--write-timeout-s", self.write_timeout),
        ):
            check_positive(flag, seconds)
        if self.forward_otlp is not None:
            url = urlsplit(self.forward_otlp)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ConfigError(
                    f"--forward-otlp: expected an http(s) URL such as "
                    f"http://tempo:4318/v1/traces, got {self.forward_otlp!r}"
                )
        for flag, path in (
            ("--web-config-file", self.web_config_file),
            ("--bearer-token-file", self.bearer_token_file),
            ("--gpu-scenario", self.gpu_scenario),
        ):
            if path is not None and not path.is_file():
                raise ConfigError(f"{flag}: {str(path)!r} is not a readable file")

    def listen_address(self) -> tuple[str | None, int]:
        """``(host, port)``; host None means every interface."""
        host, sep, port_text = self.listen.rpartition(":")
        if not sep:
            raise ConfigError(f"--listen: expected HOST:PORT or :PORT, got {self.listen!r}")
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(f"--listen: port {port_text!r} is not a number") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"--listen: port must be between 0 and 65535, got {port}")
        host = host.removeprefix("[").removesuffix("]")  # [::1]:9420
        return (host or None), port


def gpu_source_kind(value: str) -> GpuSourceKind:
    """``value`` as a ``GpuSourceKind``; a ``ConfigError`` naming ``--gpu-source`` if it is none."""
    check_choice("--gpu-source", value, tuple(GpuSourceKind))
    return GpuSourceKind(value)


_HELP: Final = {
    "listen": "HOST:PORT to serve on; ':9420' is every interface, '127.0.0.1:9420' loopback",
    "max_series": "label sets per request metric; new ones past it go to one overflow series",
    "max_label_length": "longest label value accepted from a span (characters)",
    "max_body_bytes": "largest /v1/traces body accepted, as sent (bytes)",
    "max_decompressed_bytes": "largest /v1/traces body accepted after gunzip (bytes); "
    "decoding one takes up to about 35 times this in memory, one request at a time",
    "max_spans_per_request": "spans one /v1/traces request may hold (its resource and scope "
    "groups too); more: 413, counted as too_many_spans",
    "max_attributes_per_request": "span and resource attributes one /v1/traces request may "
    "hold; more: 413, counted as too_many_attributes",
    "max_json_values_per_request": "JSON values (objects, arrays, strings, numbers) one "
    "OTLP/JSON request may hold; more: 413, counted as too_many_json_values (decoding "
    "costs about 7 microseconds a value)",
    "forward_otlp": "also send every received export request, unchanged, to this OTLP/HTTP URL",
    "forward_queue": "export requests waiting to be forwarded before new ones are dropped",
    "forward_queue_bytes": "bytes of export requests waiting to be forwarded (the one being "
    "sent included) before new ones are dropped; bounds the forwarder's memory when the "
    "backend is slow or never answers",
    "forward_timeout": "seconds one forwarded request may take",
    "web_config_file": "Prometheus exporter-toolkit web config (TLS, basic auth); read again "
    "when it changes and on SIGHUP",
    "bearer_token_file": "file holding the token that /v1/traces requests must bear; read "
    "again when it changes and on SIGHUP",
    "gpu_source": "GPU backend; auto tries DCGM, then NVML, else serves request metrics only",
    "gpu_interval": "seconds between GPU polls (in the background, never during a scrape)",
    "gpu_scenario": "scenario file for the simulated GPU source",
    "simulated_gpus": "number of simulated GPUs (with --gpu-source simulated)",
    "require_gpu": "exit with an error at start when the GPU source finds no GPU, instead of "
    "serving request metrics only",
    "max_connections": "open client connections at most, TLS handshakes included; past it "
    "the oldest idle one is closed, else the upload or non-reading client waiting longest "
    "is cut (lowered to fit the file descriptor limit)",
    "header_timeout": "seconds from a request's first byte to its complete head",
    "idle_timeout": "seconds a connection may stay open without a request (keep-alive)",
    "body_timeout": "seconds from a request's complete head to its complete body; later "
    "bodies get 408 and their connection is closed",
    "write_timeout": "seconds a connection may go without the client reading its answer "
    "(more than 64 KiB of it waiting) before it is closed; at --max-connections such a "
    "connection can be shed at once",
    "shutdown_timeout": "on SIGTERM, seconds in-flight requests (uploads included) and "
    "forwarding may take; bodies still uploading or being decoded then get 503",
    "log_level": "log level",
}


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(
        ExporterConfig,
        prog="gpuscope exporter",
        description="Prometheus scrape target: OTLP/HTTP spans in on /v1/traces, per-phase "
        "histograms and GPU counters out on /metrics. Every flag has a GPUSCOPE_* "
        "environment twin.",
        help=_HELP,
    )


def parse_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ExporterConfig:
    """Flags from ``argv``, else their ``GPUSCOPE_*`` twins in ``environ``, else defaults."""
    return flags.parse_config(ExporterConfig, build_parser(), argv, environ)
