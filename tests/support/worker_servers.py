"""The worker on a real uvicorn server, in-memory spans, and gated models for timing tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from gpuscope.worker.app import create_app
from gpuscope.worker.config import WorkerConfig
from gpuscope.worker.connections import http_protocol
from gpuscope.worker.model_api import EmbeddingModel, FloatArray, Generator
from support.servers import run_uvicorn
from support.span_recorder import SpanRecorder
from support.worker_process import WrappedGenerator

# Small models: real compute, fast on two cores.
SMALL = WorkerConfig(hidden_size=64, layers=1, vocab_size=512, max_context=512, max_new_tokens=450)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes as a plain dict (values typed loosely, for assertions)."""
    return dict(span.attributes or {})


@contextmanager
def serve_worker(
    spans: SpanRecorder | None = None,
    *,
    embedding_model: EmbeddingModel | None = None,
    generator: Generator | None = None,
    guarded: bool = False,
    **overrides: Any,
) -> Iterator[str]:
    """Serve the worker (``SMALL`` sizes plus ``overrides``) on 127.0.0.1; yields its URL.

    ``guarded``: its connections under the worker's limits, as ``gpuscope worker``
    serves them (idle and header timeouts, the cap)."""
    config = replace(SMALL, **overrides)
    app = create_app(
        config,
        tracer_provider=spans.provider if spans is not None else None,
        embedding_model=embedding_model,
        generator=generator,
    )
    options: dict[str, Any] = {}
    if guarded:
        options = {"http": http_protocol(app.listener.guard), "backlog": app.listener.backlog}
    with run_uvicorn(app, **options) as url:
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


class GatedGenerator(WrappedGenerator):
    def __init__(self, inner: Generator, gate: Gate) -> None:
        super().__init__(inner)
        self.gate = gate

    def before_step(self) -> None:
        self.gate.pass_through()
