"""Fold a serving engine's own request span into gpuscope's server span, in-process.

An engine that traces itself (vLLM with ``--otlp-traces-endpoint``) emits one request
span (``llm_request``) as a child of whatever span its request headers name; behind
``GpuscopeMiddleware`` that is gpuscope's server span. The engine span measures the
phases gpuscope's marks would (queue, prefill, decode), the server span measures the
HTTP exchange. ``EngineSpanBridge`` is a span processor on the engine's (SDK) tracer
provider that pairs the two while both are in this process:

- when an engine request span starts under a server span of this process that is
  still in flight, it is tagged ``gpuscope.request.counted``: the exporter then counts
  the request from the server span alone, whichever span it receives first;
- when that engine span ends, what it says (``gpuscope.engine_spans``) is handed to
  the request's ``RequestTimeline``, and the server span carries it as its own phases.

Both spans keep going to the trace backend (one trace per request); the histograms
count the request once, under the server span's labels (model, route, status).
Imported only when the provider is an SDK one (``add_span_processor`` exists).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from gpuscope import engine_spans
from gpuscope.middleware import stats

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from gpuscope.middleware.timeline import RequestTimeline


class EngineSpanBridge(SpanProcessor):
    """Pairs engine request spans with the in-flight server spans they belong to."""

    # It acts on engine request spans only, and gpuscope's direct spans (direct_spans)
    # are the gpuscope tracer's own (server, batch, phase), never one: they need not be
    # handed to it, and the provider does not (the "ignored" below).
    takes_direct_spans = "ignored"

    def __init__(self) -> None:
        # Every access is one dict operation, atomic under the GIL: no lock on the
        # per-request path (engines may end their spans from another thread).
        # server span id -> its request's timeline, while the response is in flight
        self._servers: dict[int, RequestTimeline] = {}
        # engine span id -> the timeline it reports to, between its start and end
        self._engines: dict[int, RequestTimeline] = {}

    def track(self, span_id: int, timeline: RequestTimeline) -> None:
        self._servers[span_id] = timeline

    def forget(self, span_id: int) -> None:
        self._servers.pop(span_id, None)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if not engine_spans.is_engine_request_span(span.name) or span.parent is None:
            return
        timeline = self._servers.get(span.parent.span_id)
        if timeline is None:
            return
        self._engines[span.context.span_id] = timeline
        # Set while the span is still mutable: the exporter reads it to count once.
        span.set_attribute(engine_spans.COUNTED_BY_SERVER_SPAN, True)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None:
            return
        timeline = self._engines.pop(span.context.span_id, None)
        if timeline is None:
            return
        try:
            timeline.engine_report = engine_spans.read_engine_span(dict(span.attributes or {}))
        except engine_spans.EngineSpanInvalid as exc:
            stats.record_failure("engine_span", exc)

    def shutdown(self) -> None:
        self._servers.clear()
        self._engines.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# One bridge per provider, however many middlewares share it.
_bridges: weakref.WeakKeyDictionary[object, EngineSpanBridge] = weakref.WeakKeyDictionary()
_bridges_lock = threading.Lock()


def bridge_for(provider: object) -> EngineSpanBridge | None:
    """The bridge on ``provider`` (added on first use), or None if it takes no processors."""
    add = getattr(provider, "add_span_processor", None)
    if add is None:
        return None
    with _bridges_lock:
        bridge = _bridges.get(provider)
        if bridge is None:
            bridge = EngineSpanBridge()
            add(bridge)
            _bridges[provider] = bridge
    return bridge
