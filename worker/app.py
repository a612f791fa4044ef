"""``create_app``: the worker's OpenAI-compatible Starlette app, wrapped by the middleware.

Endpoints: ``POST /v1/embeddings``, ``POST /v1/completions`` (``stream`` as SSE),
``GET /v1/models``, ``GET /healthz`` (counters), ``GET /readyz``. Handlers parse and
validate, hand the request to a scheduler and render what comes back; the
schedulers mark the phases. Errors use OpenAI's body: ``{"error": {...}}``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope.middleware import BatchRecorder, GpuscopeMiddleware, RequestTimeline
from gpuscope.middleware import current_timeline as _current_timeline
from gpuscope.worker import protocol
from gpuscope.worker.backends import load_backend
from gpuscope.worker.config import WorkerConfig
from gpuscope.worker.generation import GenerationScheduler, TokenStream
from gpuscope.worker.models import ByteTokenizer, EmbeddingModel, Generator
from gpuscope.worker.protocol import CompletionIds, InvalidRequest, Limits, error_body
from gpuscope.worker.scheduler import (
    BatchPolicy,
    DeviceThread,
    EmbeddingScheduler,
    QueueFull,
    SchedulerError,
)
from gpuscope.worker.streaming import (
    ClientDisconnected,
    EventStreamResponse,
    NoResponse,
    sse_event,
    unless_disconnected,
)

logger = logging.getLogger("gpuscope.worker")

HEALTH_PATHS = ("/healthz", "/readyz")


@dataclass
class Worker:
    """What the handlers share: configuration, schedulers and the tokenizer."""

    config: WorkerConfig
    limits: Limits
    tokenizer: ByteTokenizer
    device: DeviceThread
    embeddings: EmbeddingScheduler | None
    completions: GenerationScheduler | None
    created: int

    def schedulers(self) -> list[EmbeddingScheduler | GenerationScheduler]:
        return [s for s in (self.embeddings, self.completions) if s is not None]


def _error(
    status: int,
    message: str,
    *,
    kind: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = error_body(message, kind=kind, param=param, code=code)
    return JSONResponse(body, status_code=status, headers=headers)


def _invalid(exc: InvalidRequest) -> JSONResponse:
    return _error(exc.status, str(exc), kind=exc.kind, param=exc.param, code=exc.code)


def _refused(exc: SchedulerError) -> JSONResponse:
    headers = None
    if isinstance(exc, QueueFull):
        headers = {"retry-after": str(math.ceil(exc.retry_after_s))}
    kinds = {429: "rate_limit_error", 503: "server_error", 504: "timeout_error"}
    return _error(
        exc.status,
        str(exc),
        kind=kinds.get(exc.status, "server_error"),
        code=exc.code,
        headers=headers,
    )


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None


def _timeline() -> RequestTimeline:
    """The middleware's timeline for this request (a detached one without the middleware)."""
    return _current_timeline() or RequestTimeline()


class Handlers:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def embeddings(self, request: Request) -> Response:
        worker = self.worker
        if worker.embeddings is None:
            return _error(
                404, "this worker does not serve embeddings", kind="invalid_request_error"
            )
        timeline = _timeline()
        timeline.set_operation("embeddings")
        try:
            parsed = protocol.parse_embeddings(
                await _json_body(request), worker.limits, worker.tokenizer.encode
            )
            timeline.set_model(worker.config.model_name)
            timeline.set_tokens(input_tokens=parsed.input_tokens)
            work = worker.embeddings.embed(
                parsed.inputs, timeline, timeout_s=worker.config.request_timeout_s
            )
            vectors = await unless_disconnected(request, work)
        except InvalidRequest as exc:
            return _invalid(exc)
        except SchedulerError as exc:
            return _refused(exc)
        except ClientDisconnected:
            return NoResponse()
        return JSONResponse(protocol.embeddings_body(parsed, vectors, worker.config.model_name))

    async def completions(self, request: Request) -> Response:
        worker = self.worker
        if worker.completions is None:
            return _error(
                404, "this worker does not serve completions", kind="invalid_request_error"
            )
        timeline = _timeline()
        timeline.set_operation("text_completion")
        try:
            parsed = protocol.parse_completion(
                await _json_body(request), worker.limits, worker.tokenizer.encode
            )
            timeline.set_model(worker.config.model_name)
            timeline.set_tokens(input_tokens=len(parsed.prompt))
            stream = worker.completions.generate(
                list(parsed.prompt),
                parsed.max_tokens,
                timeline,
                timeout_s=worker.config.request_timeout_s,
            )
        except InvalidRequest as exc:
            return _invalid(exc)
        except SchedulerError as exc:
            return _refused(exc)
        try:
            # Wait for the first token before answering, so that a timeout is still a 504.
            first = await unless_disconnected(request, anext(stream))
        except SchedulerError as exc:
            stream.cancel()
            return _refused(exc)
        except ClientDisconnected:
            stream.cancel()
            return NoResponse()
        except BaseException:
            stream.cancel()
            raise
        timeline.add_output_tokens(1)
        ids = CompletionIds(worker.config.model_name)
        if parsed.stream:
            events = self._events(stream, first, ids, parsed, timeline)
            return EventStreamResponse(events, timeline, stream.cancel)
        return await self._whole(request, stream, first, ids, parsed, timeline)

    async def _whole(
        self,
        request: Request,
        stream: TokenStream,
        first: int,
        ids: CompletionIds,
        parsed: protocol.CompletionRequest,
        timeline: RequestTimeline,
    ) -> Response:
        decode = self.worker.tokenizer.decode_token

        async def collect() -> list[int]:
            tokens = [first]
            async for token in stream:
                timeline.add_output_tokens(1)
                tokens.append(token)
            return tokens

        try:
            tokens = await unless_disconnected(request, collect())
        except SchedulerError as exc:
            return _refused(exc)
        except ClientDisconnected:
            return NoResponse()
        finally:
            stream.cancel()
        text = "".join(decode(token) for token in tokens)
        body = ids.body(
            text, finish_reason="length", usage=protocol.usage(len(parsed.prompt), len(tokens))
        )
        return JSONResponse(body)

    async def _events(
        self,
        stream: TokenStream,
        first: int,
        ids: CompletionIds,
        parsed: protocol.CompletionRequest,
        timeline: RequestTimeline,
    ) -> AsyncIterator[bytes]:
        decode = self.worker.tokenizer.decode_token
        produced = 1
        pending = first
        try:
            async for token in stream:
                yield sse_event(ids.body(decode(pending)))
                timeline.add_output_tokens(1)
                produced += 1
                pending = token
        except SchedulerError as exc:  # too late for a status code: an error event
            yield sse_event(error_body(str(exc), kind="server_error", code=exc.code))
            return
        finally:
            stream.cancel()
        yield sse_event(ids.body(decode(pending), finish_reason="length"))
        if parsed.include_usage:
            yield sse_event(ids.body(None, usage=protocol.usage(len(parsed.prompt), produced)))
        yield sse_event("[DONE]")

    async def models(self, request: Request) -> Response:
        worker = self.worker
        return JSONResponse(protocol.models_body([worker.config.model_name], worker.created))

    async def healthz(self, request: Request) -> Response:
        body: dict[str, Any] = {"status": "ok"}
        for name, scheduler in (
            ("embeddings", self.worker.embeddings),
            ("completions", self.worker.completions),
        ):
            if scheduler is not None:
                body[name] = {"queued": scheduler.queued, **scheduler.counters.as_dict()}
        return JSONResponse(body)

    async def readyz(self, request: Request) -> Response:
        ready = all(s.accepting for s in self.worker.schedulers())
        return JSONResponse(
            {"status": "ready" if ready else "not ready"}, status_code=200 if ready else 503
        )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, exc.detail, kind="invalid_request_error")


def _build_worker(
    config: WorkerConfig,
    tracer_provider: trace.TracerProvider | None,
    embedding_model: EmbeddingModel | None,
    generator: Generator | None,
) -> Worker:
    gpu_uuid = config.gpu_uuid
    if embedding_model is None or generator is None:
        backend = load_backend(config)
        embedding_model = embedding_model or backend.embedding
        generator = generator or backend.generator
        gpu_uuid = backend.gpu_uuid
        logger.info("backend %s, gpu uuid %s", backend.name, gpu_uuid)
    policy = BatchPolicy(
        mode=config.batching,
        max_batch_size=config.max_batch_size,
        max_queue_delay_s=config.max_queue_delay_ms / 1000,
        max_queue=config.max_queue,
    )

    def recorder() -> BatchRecorder:
        return BatchRecorder(
            max_size=config.max_batch_size,
            model=config.model_name,
            gpu_uuid=gpu_uuid,
            tracer_provider=tracer_provider,
        )

    device = DeviceThread()
    limits = Limits(
        model_name=config.model_name,
        vocab_size=config.vocab_size,
        max_context=min(config.max_context, generator.max_context),
        max_new_tokens=config.max_new_tokens,
        dimensions=embedding_model.dimensions,
    )
    return Worker(
        config=config,
        limits=limits,
        tokenizer=ByteTokenizer(),
        device=device,
        embeddings=EmbeddingScheduler(embedding_model, policy, recorder(), device)
        if "embeddings" in config.serve
        else None,
        completions=GenerationScheduler(generator, policy, recorder(), device)
        if "completions" in config.serve
        else None,
        created=int(time.time()),
    )


def create_app(
    config: WorkerConfig,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    embedding_model: EmbeddingModel | None = None,
    generator: Generator | None = None,
    on_shutdown: Callable[[], None] | None = None,
) -> GpuscopeMiddleware:
    """The worker as an ASGI app; serve it with uvicorn (lifespan on).

    ``embedding_model`` / ``generator`` replace the synthetic models (your own
    ``Model`` with the same schedulers); ``tracer_provider`` defaults to the global
    one. On lifespan shutdown the schedulers stop accepting, finish what they hold
    within ``config.shutdown_timeout_s``, cancel the rest, then ``on_shutdown`` runs.
    """
    worker = _build_worker(config, tracer_provider, embedding_model, generator)
    handlers = Handlers(worker)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for scheduler in worker.schedulers():
            scheduler.start()
        try:
            yield
        finally:
            for scheduler in worker.schedulers():
                await scheduler.close(config.shutdown_timeout_s)
            worker.device.close()
            if on_shutdown is not None:
                on_shutdown()

    routes = [
        Route("/v1/embeddings", handlers.embeddings, methods=["POST"]),
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/healthz", handlers.healthz, methods=["GET"]),
        Route("/readyz", handlers.readyz, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    return GpuscopeMiddleware(
        app,
        tracer_provider=tracer_provider,
        service_name=None,
        excluded_paths=HEALTH_PATHS,
    )
