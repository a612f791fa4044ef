"""The worker on a real uvicorn server, in-memory spans, and gated models for timing tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from gpuscope.connections import ConnectionGuard
from gpuscope.worker.app import WorkerApp, create_app
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


def _app(
    spans: SpanRecorder | None,
    embedding_model: EmbeddingModel | None,
    generator: Generator | None,
    overrides: dict[str, Any],
) -> WorkerApp:
    return create_app(
        replace(SMALL, **overrides),
        tracer_provider=spans.provider if spans is not None else None,
        embedding_model=embedding_model,
        generator=generator,
    )


@contextmanager
def serve_worker(
    spans: SpanRecorder | None = None,
    *,
    embedding_model: EmbeddingModel | None = None,
    generator: Generator | None = None,
    **overrides: Any,
) -> Iterator[str]:
    """Serve the worker (``SMALL`` sizes plus ``overrides``) on 127.0.0.1; yields its URL."""
    with run_uvicorn(_app(spans, embedding_model, generator, overrides)) as url:
        yield url


@contextmanager
def serve_guarded_worker(
    *, generator: Generator | None = None, loop: str = "asyncio", **overrides: Any
) -> Iterator[tuple[str, ConnectionGuard]]:
    """``serve_worker``, its connections under the worker's limits as ``gpuscope worker``
    serves them (idle and header timeouts, the cap); yields its URL and the guard (whose
    counts a test may read from its own thread). ``loop`` is uvicorn's."""
    app = _app(None, None, generator, overrides)
    listener = app.listener
    protocol = http_protocol(listener.guard)
    with run_uvicorn(app, http=protocol, backlog=listener.backlog, loop=loop) as url:
        yield url, listener.guard


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
