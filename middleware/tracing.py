"""``setup_tracing()``: the one opt-in place that wires the OpenTelemetry SDK.

The rest of ``gpuscope.middleware`` needs only the OpenTelemetry API; this module
imports the SDK and the OTLP/HTTP exporter inside the function, so importing the
middleware never pulls them in.

Every span is sampled: gpuscope's exporter turns spans into latency histograms, and
a sampled-out request would be missing from them. Export is asynchronous through a
bounded queue (``span_pipeline``); a failing or unreachable endpoint costs dropped
spans (each one counted in ``gpuscope.middleware.stats``), never a failed request,
and ``provider.shutdown(timeout_s)`` flushes within the caller's deadline.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import unquote

from gpuscope.contract.http import DEFAULT_TRACES_URL, TRACES_PATH

if TYPE_CHECKING:
    from gpuscope.middleware.span_pipeline import BoundedTracerProvider

DEFAULT_ENDPOINT = DEFAULT_TRACES_URL


def resolve_endpoint(endpoint: str | None = None) -> str:
    """The traces URL: the argument, else the standard OTEL_* variables, else the exporter."""
    if endpoint:
        return endpoint
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if base:
        return base.rstrip("/") + TRACES_PATH
    return DEFAULT_ENDPOINT


def _env_headers() -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``: ``key=value`` pairs, comma-separated."""
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    return {unquote(k).strip(): unquote(v).strip() for k, v in pairs}


def _env_compression() -> str | None:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION") or os.environ.get(
        "OTEL_EXPORTER_OTLP_COMPRESSION"
    )


def setup_tracing(
    endpoint: str | None = None,
    service_name: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    compression: str | None = None,
    timeout_s: float = 10.0,
    max_queue_size: int = 8192,
    max_export_batch_size: int = 512,
    schedule_delay_ms: int = 500,
    shutdown_timeout_s: float = 30.0,
    set_global: bool = True,
) -> BoundedTracerProvider:
    """Create an SDK ``TracerProvider`` that sends every span over OTLP/HTTP.

    ``endpoint`` defaults to ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, then
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, then the local exporter at
    ``http://127.0.0.1:9420/v1/traces``. ``service_name`` defaults to
    ``OTEL_SERVICE_NAME``; ``headers`` and ``compression`` (``gzip``) default to the
    standard ``OTEL_EXPORTER_OTLP_*`` variables. With ``set_global`` the provider
    becomes the global one (which OpenTelemetry allows once per process). Call
    ``provider.shutdown()`` at exit to flush what is queued: it returns within
    ``shutdown_timeout_s`` (or the ``timeout_s`` it is given), whether or not the
    endpoint answers, and counts the spans it could not deliver.
    """
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from gpuscope.middleware.export import CountingExporter, OtlpHttpExporter
    from gpuscope.middleware.span_pipeline import BoundedTracerProvider, CountingBatchSpanProcessor

    attributes: dict[str, str | int] = {
        "service.instance.id": str(uuid.uuid4()),
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
    }
    name = service_name or os.environ.get("OTEL_SERVICE_NAME")
    if name:
        attributes["service.name"] = name
    otlp = OtlpHttpExporter(
        resolve_endpoint(endpoint),
        headers={**_env_headers(), **(headers or {})},
        timeout_s=timeout_s,
        compression=compression or _env_compression(),
    )
    pipeline = CountingBatchSpanProcessor(
        CountingExporter(otlp),
        max_queue_size=max_queue_size,
        max_export_batch_size=max_export_batch_size,
        schedule_delay_s=schedule_delay_ms / 1000,
    )
    provider = BoundedTracerProvider(
        pipeline,
        resource=Resource.create(attributes),
        sampler=ALWAYS_ON,
        shutdown_timeout_s=shutdown_timeout_s,
        receiver=lambda: otlp.keeps_phase_spans,
    )
    if set_global:
        trace.set_tracer_provider(provider)
    return provider
