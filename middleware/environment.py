"""What ``GpuscopeMiddleware(app)`` takes from the environment when given no arguments.

A server that adds middleware by class name with no arguments (vLLM's ``--middleware``)
leaves no place to pass a tracer provider or options, so the middleware reads them here:

- the tracer provider: the global one if the application (or the engine: vLLM sets one
  when started with ``--otlp-traces-endpoint``) installed an SDK provider by the first
  request; otherwise ``setup_tracing()`` from the standard ``OTEL_SERVICE_NAME`` and
  ``OTEL_EXPORTER_OTLP_*`` variables (default: the local exporter), flushed at exit.
  ``OTEL_SDK_DISABLED=true`` turns that off, as it turns off the SDK everywhere;
- ``GPUSCOPE_EXCLUDED_PATHS``: comma-separated paths served untraced (``/metrics,/health``);
- ``GPUSCOPE_SERVICE_NAME``: the ``service`` label, where several apps share a process;
- ``GPUSCOPE_GPU_UUID``: the GPU every request of this process runs on, where the exporter
  cannot find it from the process (see docs/engines/vllm.md);
- ``GPUSCOPE_PHASE_SPANS``: ``on``, ``off`` or ``auto`` (the default), the phase child
  spans (``phase_spans``); the worker's ``--phase-spans`` has the same twin.
Arguments given to the middleware always win over these variables.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from opentelemetry import trace

from gpuscope.middleware.phase_spans import PhaseSpans

logger = logging.getLogger("gpuscope.middleware")

EXCLUDED_PATHS_VARIABLE = "GPUSCOPE_EXCLUDED_PATHS"
SERVICE_NAME_VARIABLE = "GPUSCOPE_SERVICE_NAME"
GPU_UUID_VARIABLE = "GPUSCOPE_GPU_UUID"
PHASE_SPANS_VARIABLE = "GPUSCOPE_PHASE_SPANS"
SDK_DISABLED_VARIABLE = "OTEL_SDK_DISABLED"

_setup_lock = threading.Lock()


def excluded_paths() -> frozenset[str]:
    raw = os.environ.get(EXCLUDED_PATHS_VARIABLE, "")
    return frozenset(path.strip() for path in raw.split(",") if path.strip())


def service_name() -> str | None:
    return os.environ.get(SERVICE_NAME_VARIABLE) or None


def gpu_uuid() -> str | None:
    return os.environ.get(GPU_UUID_VARIABLE) or None


def phase_spans() -> PhaseSpans:
    """``GPUSCOPE_PHASE_SPANS``; ``auto`` when unset, and (with a warning) when unknown."""
    raw = os.environ.get(PHASE_SPANS_VARIABLE, "").strip().lower()
    if not raw:
        return PhaseSpans.AUTO
    try:
        return PhaseSpans(raw)
    except ValueError:
        choices = ", ".join(mode.value for mode in PhaseSpans)
        logger.warning(
            "gpuscope: %s=%r is not one of %s; using auto", PHASE_SPANS_VARIABLE, raw, choices
        )
        return PhaseSpans.AUTO


def tracing_disabled() -> bool:
    return os.environ.get(SDK_DISABLED_VARIABLE, "").strip().lower() == "true"


def global_provider() -> trace.TracerProvider:
    """The global provider; if nobody installed one, gpuscope's from the environment.

    Called at the first request, not at construction: an application that builds the
    middleware first and installs its own provider afterwards keeps its provider.
    """
    with _setup_lock:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, trace.ProxyTracerProvider) or tracing_disabled():
            return provider
        from gpuscope.middleware.tracing import resolve_endpoint, setup_tracing

        own = setup_tracing()
        atexit.register(own.shutdown)
        logger.info(
            "gpuscope: no tracer provider was installed; exporting spans to %s "
            "(set OTEL_EXPORTER_OTLP_TRACES_ENDPOINT to change it)",
            resolve_endpoint(),
        )
        return own
