"""The worker on a real uvicorn server, in-memory spans, and gated models for timing tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpuscope.worker.app import create_app
from gpuscope.worker.config import WorkerConfig
from gpuscope.worker.kv_cache import BlockPool, SequenceState
from gpuscope.worker.model_api import EmbeddingModel, FloatArray, Generator
from support.middleware_spans import EndNotifier
from support.servers import run_uvicorn

# Small models: real compute, fast on two cores.
SMALL = WorkerConfig(hidden_size=64, layers=1, vocab_size=512, max_context=512, max_new_tokens=450)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes as a plain dict (values typed loosely, for assertions)."""
    return dict(span.attributes or {})


@dataclass
class WorkerSpans:
    provider: TracerProvider
    exporter: InMemorySpanExporter
    condition: threading.Condition = field(default_factory=threading.Condition)

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def servers(self, route: str | None = None) -> list[ReadableSpan]:
        spans = [s for s in self.all() if s.kind.name == "SERVER"]
        if route is None:
            return spans
        return [s for s in spans if (s.attributes or {}).get("http.route") == route]

    def batches(self) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == "gpuscope.batch"]

    def wait_for(self, predicate: Callable[[WorkerSpans], bool], timeout: float = 10.0) -> None:
        with self.condition:
            if not self.condition.wait_for(lambda: predicate(self), timeout):
                pytest.fail(f"spans never matched: {[s.name for s in self.all()]}")


@pytest.fixture
def worker_spans() -> Iterator[WorkerSpans]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = WorkerSpans(provider, exporter)
    provider.add_span_processor(EndNotifier(spans.condition))
    yield spans
    provider.shutdown()


@contextmanager
def serve_worker(
    spans: WorkerSpans | None = None,
    *,
    embedding_model: EmbeddingModel | None = None,
    generator: Generator | None = None,
    **overrides: Any,
) -> Iterator[str]:
    """Serve the worker (``SMALL`` sizes plus ``overrides``) on 127.0.0.1; yields its URL."""
    config = replace(SMALL, **overrides)
    app = create_app(
        config,
        tracer_provider=spans.provider if spans is not None else None,
        embedding_model=embedding_model,
        generator=generator,
    )
    with run_uvicorn(app) as url:
        yield url


class Gate:
    """Holds the device thread at the next model call until opened (a slow GPU)."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.entered = threading.Event()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def pass_through(self) -> None:
        self.entered.set()
        if not self._open.wait(timeout=30):
            raise RuntimeError("gate never opened")


class GatedEmbeddingModel:
    def __init__(self, inner: EmbeddingModel, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    def embed(self, batch: Sequence[Sequence[int]]) -> FloatArray:
        self.gate.pass_through()
        return self.inner.embed(batch)


class GatedGenerator:
    def __init__(self, inner: Generator, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def kv_pool(self) -> BlockPool:
        return self.inner.kv_pool

    def start(self, prompt: Sequence[int]) -> SequenceState:
        return self.inner.start(prompt)

    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        self.gate.pass_through()
        return self.inner.step(sequences)
