"""The ``gpuscope.queue`` / ``batch_wait`` / ``compute`` child spans of a server span.

They are emitted once the request has finished, when their start and end are known
marks. Through the API each costs a full ``start_span`` (sampler, attribute
containers, processor ``on_start``): about 20 µs, and most of the middleware's cost.
When the provider is the OpenTelemetry SDK's, the children are instead handed, already
finished, to the provider's span processors as ``ReadableSpan`` objects: the same
span the SDK would have produced (same trace, parent, flags, resource, scope), at a
few µs each. Differences: span processors see ``on_end`` only, not ``on_start``, and
the sampler is not consulted (children follow their sampled parent, as the default
``ParentBased`` sampler would decide). Any other provider gets the API path.
``tests/middleware/test_middleware_phase_spans.py`` checks both paths give equal spans.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind

from gpuscope import __version__
from gpuscope.spans import INSTRUMENTATION_NAME

Child = tuple[str, int, int]  # name, start epoch ns, end epoch ns


class _SdkParts:
    """What a finished span needs from an SDK ``TracerProvider``."""

    __slots__ = ("id_generator", "processor", "readable_span", "resource", "scope")

    def __init__(self, provider: Any) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.processor = provider._active_span_processor
        self.resource = provider.resource
        self.id_generator = provider.id_generator
        self.scope = InstrumentationScope(INSTRUMENTATION_NAME, __version__)
        self.readable_span = ReadableSpan


def _sdk_parts(provider: object) -> _SdkParts | None:
    module = type(provider).__module__
    if not module.startswith("opentelemetry.sdk.trace"):
        return None
    if not all(hasattr(provider, n) for n in ("_active_span_processor", "id_generator")):
        return None
    return _SdkParts(provider)


class PhaseSpanEmitter:
    """Emits finished child spans under a server span, by the cheapest correct path."""

    def __init__(self, tracer: trace.Tracer, tracer_provider: trace.TracerProvider | None) -> None:
        self.tracer = tracer
        self.explicit_provider = tracer_provider
        self._provider: object = None
        self._parts: _SdkParts | None = None

    def emit(self, parent: trace.Span, children: Iterable[Child]) -> None:
        parts = self._resolve()
        if parts is None:
            self._emit_via_api(parent, children)
            return
        parent_context = parent.get_span_context()
        if not parent_context.trace_flags.sampled:
            return
        for name, start_ns, end_ns in children:
            context = SpanContext(
                parent_context.trace_id,
                parts.id_generator.generate_span_id(),
                is_remote=False,
                trace_flags=parent_context.trace_flags,
                trace_state=parent_context.trace_state,
            )
            span = parts.readable_span(
                name,
                context=context,
                parent=parent_context,
                resource=parts.resource,
                attributes={},
                kind=SpanKind.INTERNAL,
                start_time=start_ns,
                end_time=end_ns,
                instrumentation_scope=parts.scope,
            )
            parts.processor.on_end(span)

    def _resolve(self) -> _SdkParts | None:
        # The global provider may be set after the middleware was built: look each time,
        # rebuild the cached parts only when it changed.
        provider = self.explicit_provider or trace.get_tracer_provider()
        if provider is not self._provider:
            self._parts = _sdk_parts(provider)
            self._provider = provider
        return self._parts

    def _emit_via_api(self, parent: trace.Span, children: Iterable[Child]) -> None:
        context = trace.set_span_in_context(parent)
        for name, start_ns, end_ns in children:
            child = self.tracer.start_span(name, context, SpanKind.INTERNAL, start_time=start_ns)
            child.end(end_time=end_ns)
