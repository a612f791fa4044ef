"""Request phases as OpenTelemetry spans: the drop-in ASGI middleware and phase API.

    from gpuscope.middleware import GpuscopeMiddleware, setup_tracing

    setup_tracing(service_name="my-inference")   # OTLP/HTTP to the gpuscope exporter
    app = GpuscopeMiddleware(app)

Inside a request, ``current_timeline()`` returns its ``RequestTimeline``; a batching
scheduler marks phases on it and runs batches through a ``BatchRecorder``.
Importing this package needs only the OpenTelemetry API.
"""

from gpuscope.middleware.asgi import GpuscopeMiddleware
from gpuscope.middleware.batch import Batch, BatchRecorder
from gpuscope.middleware.phase_spans import PhaseSpans
from gpuscope.middleware.timeline import RequestTimeline, current_timeline
from gpuscope.middleware.tracing import setup_tracing

__all__ = [
    "Batch",
    "BatchRecorder",
    "GpuscopeMiddleware",
    "PhaseSpans",
    "RequestTimeline",
    "current_timeline",
    "setup_tracing",
]
