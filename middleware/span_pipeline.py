"""The SDK side of ``setup_tracing()``: a span queue with a bounded shutdown.

``TracerProvider.shutdown()`` gives its span processors no deadline, and the SDK's
``BatchSpanProcessor`` then waits up to 30 s for a flush whatever the process's own
shutdown budget is: a worker whose receiver is gone would outlive its pod's grace
period. That is why ``setup_tracing()`` has a processor of its own. (The SDK counts
its drops since 1.45, ``otel.sdk.processor.span.processed`` with an error type, but
only through a ``MeterProvider`` the process must set up and read; the counts below
need none and land in ``stats`` beside the middleware's other failures.)
``CountingBatchSpanProcessor`` counts each finished span's fate in
``stats``: exported (``spans_exported``), refused or undeliverable
(``spans_export_failed``, counted by ``CountingExporter``), or dropped, because the queue
was full (``spans_dropped_queue_full``) or shutdown came first
(``spans_dropped_shutdown``). Its ``shutdown`` takes a deadline, and
``BoundedTracerProvider`` passes one down, so a process exits on time even when the
endpoint is unreachable. Imported only by ``setup_tracing()`` (it needs the SDK).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import Attributes

from gpuscope import spans
from gpuscope.middleware import stats
from gpuscope.middleware.direct_spans import DirectTracer
from gpuscope.middleware.export import RetryingExporter

# After the deadline, how long an export already on the wire may take to give up.
_ABORT_GRACE_S = 0.5
# From the start of shutdown, how long failed exports are still retried. Past it each
# queued batch gets one attempt within the shutdown's deadline: a receiver that refuses
# connections or answers 503 now has most likely gone with this process (its pod, the
# demo that started both), and retrying it would hold the exit for the whole deadline.
SHUTDOWN_RETRY_S = 1.0


class CountingBatchSpanProcessor(SpanProcessor):
    """Batches finished spans to ``exporter`` from one thread; counts every drop."""

    # on_start does nothing and on_end reads a ReadableSpan: direct spans will do
    takes_direct_spans = True

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 8192,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 0.5,
    ) -> None:
        if max_queue_size < 1 or not 1 <= max_export_batch_size <= max_queue_size:
            raise ValueError("need 1 <= max_export_batch_size <= max_queue_size")
        self.exporter = exporter
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = max_export_batch_size
        self.schedule_delay_s = schedule_delay_s
        self._closing = False
        self._deadline = 0.0
        self._start()
        # A process forked after setup (a pre-loading server) gets its own queue and thread.
        reinit = weakref.WeakMethod(self._start)
        os.register_at_fork(after_in_child=lambda: _call_if_alive(reinit))

    def _start(self) -> None:
        self._queue: deque[ReadableSpan] = deque()
        self._changed = threading.Condition()
        self._export_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="gpuscope-spans", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return
        with self._changed:
            if self._closing:
                stats.count(stats.SPANS_DROPPED_SHUTDOWN)
                return
            if len(self._queue) >= self.max_queue_size:
                stats.count(stats.SPANS_DROPPED_QUEUE_FULL)
                return
            self._queue.append(span)
            if len(self._queue) >= self.max_export_batch_size:
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                if not self._closing and len(self._queue) < self.max_export_batch_size:
                    self._changed.wait(self.schedule_delay_s)
                closing, deadline = self._closing, self._deadline
            self._drain(deadline if closing else None)
            if closing:
                return

    def _drain(self, deadline: float | None) -> bool:
        """Export batches until the queue is empty (True) or a deadline passes.

        The deadline is ``deadline`` or, once shutdown has begun, shutdown's own.
        """
        with self._export_lock:
            while True:
                with self._changed:
                    limit = self._deadline if self._closing else deadline
                    if limit is not None and time.monotonic() >= limit:
                        return False
                    count = min(len(self._queue), self.max_export_batch_size)
                    batch = [self._queue.popleft() for _ in range(count)]
                if not batch:
                    return True
                self.exporter.export(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._drain(time.monotonic() + timeout_millis / 1000)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Export what is queued until ``timeout_s`` from now; drop (and count) the rest."""
        with self._changed:
            if self._closing:
                return
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._changed.notify()
        if isinstance(self.exporter, RetryingExporter):
            self.exporter.retry_until(time.monotonic() + min(SHUTDOWN_RETRY_S, timeout_s))
        self._thread.join(max(0.0, self._deadline - time.monotonic()))
        # Stops the exporter's retries and backoff; an export on the wire then gives up.
        self.exporter.shutdown()
        self._thread.join(_ABORT_GRACE_S)
        with self._changed:
            left, self._queue = len(self._queue), deque()
        stats.count(stats.SPANS_DROPPED_SHUTDOWN, left)

    def idle(self) -> bool:
        """True once shutdown has finished every export (tests wait on it)."""
        return not self._thread.is_alive()


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()


class BoundedTracerProvider(TracerProvider):
    """A ``TracerProvider`` whose ``shutdown`` flushes within a deadline.

    ``shutdown(timeout_s)`` gives gpuscope's span pipeline at most ``timeout_s``
    (default: the one given at construction) before the other processors shut down.
    ``receiver_keeps_phase_spans()`` asks ``receiver`` (the exporter's last answer,
    see ``phase_spans``); None without one. The ``gpuscope`` instrumentation's tracer
    builds its spans directly (``direct_spans``) while every processor takes them.
    """

    def __init__(
        self,
        pipeline: CountingBatchSpanProcessor,
        *,
        resource: Resource,
        sampler: Sampler,
        shutdown_timeout_s: float,
        receiver: Callable[[], bool | None] | None = None,
    ) -> None:
        super().__init__(resource=resource, sampler=sampler)
        self.pipeline = pipeline
        self.shutdown_timeout_s = shutdown_timeout_s
        self._receiver = receiver
        self._direct_sampler = sampler is ALWAYS_ON
        # The processors a direct span is handed to; None once one of them needs SDK
        # spans. Replaced whole, never mutated: request threads read it unlocked.
        self._direct: tuple[SpanProcessor, ...] | None = ()
        self.add_span_processor(pipeline)

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        # ``takes_direct_spans``: True, hand it direct spans; "ignored", it would do
        # nothing with one, so skip it; anything else, it needs the SDK's spans.
        takes_direct = getattr(span_processor, "takes_direct_spans", False)
        if self._direct is None or takes_direct == "ignored":
            return
        if takes_direct is True:
            self._direct = (*self._direct, span_processor)
        else:
            self._direct = None

    def direct_processors(self) -> tuple[SpanProcessor, ...] | None:
        return self._direct

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        tracer = super().get_tracer(
            instrumenting_module_name, instrumenting_library_version, schema_url, attributes
        )
        if instrumenting_module_name != spans.INSTRUMENTATION_NAME or not self._direct_sampler:
            return tracer
        if not isinstance(tracer, Tracer):  # OTEL_SDK_DISABLED: the SDK's no-op tracer
            return tracer
        scope = InstrumentationScope(
            instrumenting_module_name, instrumenting_library_version, schema_url, attributes
        )
        return DirectTracer(tracer, scope, self.resource, self.id_generator, self.direct_processors)

    def receiver_keeps_phase_spans(self) -> bool | None:
        return None if self._receiver is None else self._receiver()

    def shutdown(self, timeout_s: float | None = None) -> None:
        self.pipeline.shutdown(self.shutdown_timeout_s if timeout_s is None else timeout_s)
        super().shutdown()  # gpuscope's processor is closed already: returns at once
