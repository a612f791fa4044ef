"""The ``gpuscope.queue`` / ``batch_wait`` / ``compute`` child spans of a server span.

Off unless asked for. The exporter reads the phases from the server span's
attributes (``gpuscope.phase.*.duration``) and drops the children, so they only
matter where the spans also reach a trace backend (Tempo, Jaeger), whose trace view
shows them as bars under the request. ``PhaseSpans``: ``on``, ``off``, or ``auto``
(the default): on when this process's own span exporter (``setup_tracing()``) is
known to deliver to a trace backend. Its receiver says so in each answer
(``ReportsReceiver``): a gpuscope exporter answers ``Gpuscope-Phase-Spans: dropped``,
or ``forwarded`` when it forwards to a backend (``--forward-otlp``); any other
receiver (a collector, a backend) does not answer the header and is taken to keep
them. Until the first answer, and under a tracer provider that is not
``setup_tracing()``'s, ``auto`` means off.

They are emitted once the request has finished, when their start and end are known
marks, through the public tracing API (``start_span`` with the marks as times), so
every span processor and sampler sees them as any other span.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Protocol, runtime_checkable

from opentelemetry import trace
from opentelemetry.trace import SpanKind

Child = tuple[str, int, int]  # name, start epoch ns, end epoch ns


class PhaseSpans(StrEnum):
    """Whether the phase child spans are emitted."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


@runtime_checkable
class ReportsReceiver(Protocol):
    """A tracer provider that knows whether its spans' receiver keeps phase spans:
    True or False once it has answered, None before."""

    def receiver_keeps_phase_spans(self) -> bool | None: ...


class PhaseSpanEmitter:
    """Emits finished child spans under a server span, when ``mode`` says so."""

    def __init__(
        self,
        tracer: trace.Tracer,
        tracer_provider: trace.TracerProvider | None,
        mode: PhaseSpans = PhaseSpans.AUTO,
    ) -> None:
        self.tracer = tracer
        self.explicit_provider = tracer_provider
        self.mode = mode

    def wanted(self) -> bool:
        if self.mode is not PhaseSpans.AUTO:
            return self.mode is PhaseSpans.ON
        # The global provider may be set after the middleware was built: look each time.
        provider = self.explicit_provider or trace.get_tracer_provider()
        return (
            isinstance(provider, ReportsReceiver) and provider.receiver_keeps_phase_spans() is True
        )

    def emit(self, parent: trace.Span, children: Iterable[Child]) -> None:
        context = trace.set_span_in_context(parent)
        for name, start_ns, end_ns in children:
            child = self.tracer.start_span(name, context, SpanKind.INTERNAL, start_time=start_ns)
            child.end(end_time=end_ns)
