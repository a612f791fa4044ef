"""``ExporterConfig``: every flag of ``gpuscope exporter``, parsed once from argv and environment.

Each flag ``--some-flag`` has the environment twin ``GPUSCOPE_SOME_FLAG``; a flag on
the command line wins over its twin. Validation errors name the flag.

``--listen :9420`` (the default) binds every interface, as Prometheus exporters do,
so that a scraper in another container or host can reach it; ``127.0.0.1:9420``
keeps it on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpuscope import flags
from gpuscope.contract.gpu import UP
from gpuscope.contract.http import DEFAULT_LISTEN, LOOPBACK_LISTEN, METRICS_PATH, TRACES_PATH
from gpuscope.exporter.gpu.source import GpuSourceKind
from gpuscope.flags import (
    LOG_LEVELS,
    ConfigError,
    Settings,
    at_least,
    http_url,
    one_of,
    option,
    positive,
    readable_file,
)

__all__ = ["ConfigError", "ExporterConfig"]

MIB: Final = 1024 * 1024
_COUNT = at_least(1)


def _host_port(flag: str, listen: str) -> tuple[str | None, int]:
    host, sep, port_text = listen.rpartition(":")
    if not sep:
        raise ConfigError(f"{flag}: expected HOST:PORT or :PORT, got {listen!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{flag}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{flag}: port must be between 0 and 65535, got {port}")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:9420
    return (host or None), port


def _listen(flag: str, listen: str) -> None:
    _host_port(flag, listen)


@dataclass(frozen=True)
class ExporterConfig(
    Settings,
    prog="gpuscope exporter",
    description=f"Prometheus scrape target: OTLP/HTTP spans in on {TRACES_PATH}, per-phase "
    f"histograms and GPU counters out on {METRICS_PATH}.",
):
    listen: str = option(
        DEFAULT_LISTEN,
        help=f"where to serve; '{DEFAULT_LISTEN}' is every interface, '{LOOPBACK_LISTEN}' loopback",
        metavar="HOST:PORT",
        check=_listen,
    )
    max_series: int = option(
        2000,
        help="label sets per request metric; new ones past it go to one overflow series",
        check=_COUNT,
    )
    max_models_per_service: int = option(
        20,
        help="distinct model label values per service; further ones share one "
        'model="__overflow__" series set of that service, so one service cannot fill '
        "--max-series for the others",
        check=_COUNT,
    )
    max_label_length: int = option(
        128, help="longest label value accepted from a span", unit="characters", check=_COUNT
    )
    max_body_bytes: int = option(
        8 * MIB, help="largest /v1/traces body accepted, as sent", check=_COUNT
    )
    max_decompressed_bytes: int = option(
        20 * MIB,
        help="largest /v1/traces body accepted after gunzip; decoding one takes up to about "
        "35 times this in memory, one request at a time",
        check=_COUNT,
    )
    max_spans_per_request: int = option(
        100_000,
        help="spans one /v1/traces request may hold (its resource and scope groups too); "
        "more: 413, counted as too_many_spans",
        check=_COUNT,
    )
    max_attributes_per_request: int = option(
        1_000_000,
        help="span and resource attributes one /v1/traces request may hold; more: 413, "
        "counted as too_many_attributes",
        check=_COUNT,
    )
    max_json_values_per_request: int = option(
        1_000_000,
        help="JSON values (objects, arrays, strings, numbers) one OTLP/JSON request may "
        "hold; more: 413, counted as too_many_json_values (decoding costs about 7 "
        "microseconds a value)",
        check=_COUNT,
    )
    max_ingest_bytes: int = option(
        96 * MIB,
        help="bytes that /v1/traces bodies may hold at once, all requests together: each "
        "body as sent from before it is read (its declared length) until it is decoded, "
        "and the one being decoded after gunzip; past it: 429 with Retry-After, counted as "
        "ingest_memory_full (the default fits the Kubernetes manifests' memory limit with "
        "the decoder's and the process's own)",
        check=_COUNT,
    )
    max_decode_cpu_s: float = option(
        2.0,
        help="CPU time the ingest thread may spend decoding one OTLP/JSON request; past it: "
        "413, counted as decode_budget",
        check=positive,
    )
    ingest_timeout_s: float = option(
        5.0,
        help="how long a /v1/traces request may wait for its turn and its decode once its "
        "body is in; past it: 503 with Retry-After, never counted (abandoned); below the "
        "OpenTelemetry SDK's 10 s timeout so that the SDK has time to retry",
        check=positive,
    )
    forward_otlp: str | None = option(
        None,
        help="also send every received export request, unchanged, to this OTLP/HTTP URL",
        check=http_url(f"http://tempo:4318{TRACES_PATH}"),
    )
    forward_queue: int = option(
        256,
        help="export requests waiting to be forwarded before new ones are dropped",
        unit="requests",
        check=_COUNT,
    )
    forward_queue_bytes: int = option(
        64 * MIB,
        help="bytes of export requests waiting to be forwarded (the one being sent "
        "included) before new ones are dropped; bounds the forwarder's memory when the "
        "backend is slow or never answers",
        check=_COUNT,
    )
    forward_timeout_s: float = option(
        10.0,
        help="how long one forwarded request may take",
        check=positive,
        deprecated=("--forward-timeout",),
    )
    web_config_file: Path | None = option(
        None,
        help="Prometheus exporter-toolkit web config (TLS, basic auth); read again when it "
        "changes and on SIGHUP",
        check=readable_file,
    )
    bearer_token_file: Path | None = option(
        None,
        help="file holding the token that /v1/traces requests must bear; read again when "
        "it changes and on SIGHUP",
        check=readable_file,
    )
    gpu_source: GpuSourceKind = option(
        GpuSourceKind.AUTO,
        help="GPU backend; auto tries NVML, else serves request metrics only (dcgm: retired, "
        "see docs/gpu.md)",
    )
    gpu_interval_s: float = option(
        1.0,
        help="time between GPU polls (in the background, never during a scrape)",
        check=positive,
        deprecated=("--gpu-interval",),
    )
    gpu_poll_deadline_s: float | None = option(
        None,
        help=f"how long a GPU poll may take before its GPUs read down ({UP.name} 0, "
        "reason poll_overdue) and /readyz fails; default twice --gpu-interval-s, at least 2",
        check=positive,
    )
    gpu_scenario: Path | None = option(
        None, help="scenario file for the simulated GPU source", check=readable_file
    )
    simulated_gpus: int = option(
        1, help="number of simulated GPUs (with --gpu-source simulated)", check=_COUNT
    )
    require_gpu: bool = option(
        False,
        help="exit with an error at start when the GPU source finds no GPU, instead of "
        "serving request metrics only",
    )
    process_join_needs_auth: bool = option(
        False,
        help="join a span's process.pid to its process's GPUs only when the request was "
        "authenticated (bearer token or basic auth on /v1/traces); without authentication "
        "any sender can claim another process's GPU",
    )
    max_connections: int = option(
        512,
        help="open client connections at most, TLS handshakes included; past it the oldest "
        "idle one is closed, else the upload or non-reading client waiting longest is cut "
        "(lowered to fit the file descriptor limit)",
        check=_COUNT,
    )
    header_timeout_s: float = option(
        10.0, help="time from a request's first byte to its complete head", check=positive
    )
    idle_timeout_s: float = option(
        60.0,
        help="how long a connection may stay open without a request (keep-alive)",
        check=positive,
    )
    body_timeout_s: float = option(
        30.0,
        help="time from a request's complete head to its complete body; later bodies get "
        "408 and their connection is closed",
        check=positive,
    )
    write_timeout_s: float = option(
        30.0,
        help="how long a connection may go without the client reading its answer (more "
        "than 64 KiB of it waiting) before it is closed; at --max-connections such a "
        "connection can be shed at once",
        check=positive,
    )
    shutdown_timeout_s: float = option(
        10.0,
        help="on SIGTERM, how long in-flight requests (uploads included) and forwarding may "
        "take; bodies still uploading or being decoded then get 503",
        check=positive,
        deprecated=("--shutdown-timeout",),
    )
    log_level: str = option("info", help="log level", check=one_of(LOG_LEVELS))

    def check(self) -> None:
        if self.require_gpu and self.gpu_source == GpuSourceKind.NONE:
            raise ConfigError(
                f"{flags.spelling(ExporterConfig, 'require_gpu')}: "
                f"{flags.spelling(ExporterConfig, 'gpu_source')} none opens no GPU"
            )

    def listen_address(self) -> tuple[str | None, int]:
        """``(host, port)``; host None means every interface."""
        return _host_port(flags.spelling(ExporterConfig, "listen"), self.listen)
