"""An SDK tracer provider that keeps finished spans in memory, for assertions: the
``span_recorder`` fixture of the middleware and worker tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuscope import spans as contract
from gpuscope.middleware import stats


class EndNotifier(SpanProcessor):
    """Wakes waiters whenever a span ends (spans may end on a server thread)."""

    def __init__(self, condition: threading.Condition) -> None:
        self.condition = condition

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self.condition:
            self.condition.notify_all()


@dataclass
class SpanRecorder:
    provider: TracerProvider
    exporter: InMemorySpanExporter
    condition: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(
        self, predicate: Callable[[SpanRecorder], bool], timeout: float = 10.0
    ) -> list[ReadableSpan]:
        """Block until ``predicate(self)`` holds and return the spans; fail the test
        after ``timeout`` s."""
        with self.condition:
            if not self.condition.wait_for(lambda: predicate(self), timeout):
                pytest.fail(f"spans never matched; have {[s.name for s in self.spans()]}")
        return self.spans()

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans() if span.name == name]

    def server_spans(self, route: str | None = None) -> list[ReadableSpan]:
        """Server spans, of ``route`` only when given."""
        servers = [span for span in self.spans() if span.kind.name == "SERVER"]
        if route is None:
            return servers
        return [s for s in servers if (s.attributes or {}).get(contract.HTTP_ROUTE) == route]

    def batches(self) -> list[ReadableSpan]:
        return self.named(contract.BATCH_SPAN_NAME)

    def children_of(self, parent: ReadableSpan) -> list[ReadableSpan]:
        parent_id = parent.context.span_id
        return [s for s in self.spans() if s.parent is not None and s.parent.span_id == parent_id]


@pytest.fixture
def span_recorder() -> Iterator[SpanRecorder]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    recorder = SpanRecorder(provider, exporter)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(EndNotifier(recorder.condition))
    stats.reset()
    yield recorder
    provider.shutdown()
