"""``create_app``: the worker's OpenAI-compatible Starlette app, wrapped by the middleware.

Endpoints: ``POST /v1/embeddings``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (``stream`` as SSE), ``GET /v1/models`` and
``/v1/models/{model}``; operations: ``/health``, ``/healthz`` (counters), ``/readyz``,
``/version``, ``/metrics``. Handlers parse and validate, hand the request to a
scheduler of the ``runtime.Worker`` and render what comes back; the schedulers mark
the phases. Every error is an exception rendered once, in OpenAI's shape, by
``errors.EXCEPTION_HANDLERS``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

from opentelemetry import trace
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuscope import __version__
from gpuscope.contract import worker as rows
from gpuscope.contract.http import HEALTHZ_PATH, METRICS_PATH, READYZ_PATH
from gpuscope.families import ConnectionCollector
from gpuscope.middleware import GpuscopeMiddleware, RequestTimeline
from gpuscope.middleware import current_timeline as _current_timeline
from gpuscope.worker import chat, protocol, responses
from gpuscope.worker.config import WorkerConfig
from gpuscope.worker.connections import ConnectionTracking, Listener
from gpuscope.worker.errors import EXCEPTION_HANDLERS
from gpuscope.worker.metrics import WorkerCollector, metrics_endpoint
from gpuscope.worker.model_api import EmbeddingModel, Generator
from gpuscope.worker.protocol import GenerationOptions, InvalidRequest
from gpuscope.worker.request_body import read_json
from gpuscope.worker.responses import CompletionIds
from gpuscope.worker.runtime import Worker, build_worker
from gpuscope.worker.streaming import unless_disconnected
from gpuscope.worker.text_generation import Bodies, GenerationRun

# Operational endpoints are not traced: probes and scrapes would drown the requests.
UNTRACED_PATHS: Final = ("/health", HEALTHZ_PATH, READYZ_PATH, "/version", METRICS_PATH)


def _timeline() -> RequestTimeline:
    """The middleware's timeline for this request (a detached one without the middleware)."""
    return _current_timeline() or RequestTimeline()


def _not_served(what: str) -> InvalidRequest:
    return InvalidRequest(f"this worker does not serve {what}", status=404)


class Handlers:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def _body(self, request: Request) -> Any:
        config = self.worker.config
        return await read_json(request, config.max_body_bytes, config.request_timeout_s)

    async def embeddings(self, request: Request) -> Response:
        worker = self.worker
        if worker.embeddings is None:
            raise _not_served("embeddings")
        timeline = _timeline()
        timeline.set_operation("embeddings")
        parsed = protocol.parse_embeddings(
            await self._body(request), worker.limits, worker.tokenizer.encode
        )
        timeline.set_model(worker.config.model_name)
        timeline.set_tokens(input_tokens=parsed.input_tokens)
        work = worker.embeddings.embed(
            parsed.inputs, timeline, timeout_s=worker.config.request_timeout_s
        )
        vectors = await unless_disconnected(request, work)
        return JSONResponse(responses.embeddings_body(parsed, vectors, worker.config.model_name))

    async def completions(self, request: Request) -> Response:
        worker = self.worker
        timeline = self._generation_timeline("text_completion")
        parsed = protocol.parse_completion(
            await self._body(request), worker.limits, worker.tokenizer.encode
        )
        if len(parsed.prompts) > worker.policy.max_queue:  # 429 would invite a vain retry
            raise InvalidRequest(
                f"'prompt' holds {len(parsed.prompts)} prompts; this worker queues at most "
                f"{worker.policy.max_queue} (--max-queue)",
                param="prompt",
            )
        bodies = responses.CompletionBodies(
            CompletionIds(worker.config.model_name), parsed.options.include_usage
        )
        return await self._generate(request, timeline, parsed.prompts, parsed.options, bodies)

    async def chat_completions(self, request: Request) -> Response:
        worker = self.worker
        timeline = self._generation_timeline("chat")
        parsed = chat.parse_chat(await self._body(request), worker.limits, worker.tokenizer.encode)
        bodies = chat.ChatBodies(
            CompletionIds(worker.config.model_name, prefix="chatcmpl"),
            parsed.options.include_usage,
        )
        return await self._generate(request, timeline, (parsed.prompt,), parsed.options, bodies)

    def _generation_timeline(self, operation: str) -> RequestTimeline:
        """This request's timeline, named after ``operation``; 404 without generation."""
        timeline = _timeline()
        timeline.set_operation(operation)
        if self.worker.completions is None:
            raise _not_served("completions")
        return timeline

    async def _generate(
        self,
        request: Request,
        timeline: RequestTimeline,
        prompts: tuple[tuple[int, ...], ...],
        options: GenerationOptions,
        bodies: Bodies,
    ) -> Response:
        worker = self.worker
        assert worker.completions is not None  # checked by ``_generation_timeline``
        timeline.set_model(worker.config.model_name)
        timeline.set_tokens(input_tokens=sum(len(prompt) for prompt in prompts))
        run = GenerationRun(
            worker.completions,
            prompts,
            options,
            worker.tokenizer.decode_token,
            timeline,
            worker.config.request_timeout_s,
        )
        return await run.answer(request, bodies)

    def _card(self) -> dict[str, Any]:
        worker = self.worker
        return responses.model_card(
            worker.config.model_name, worker.created, worker.limits.max_context
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse(responses.models_body([self._card()]))

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name != self.worker.config.model_name:
            raise InvalidRequest(
                f"the model '{name}' does not exist",
                param="model",
                status=404,
                code="model_not_found",
            )
        return JSONResponse(self._card())

    async def health(self, request: Request) -> Response:
        """vLLM's probe: 200 while serving, 503 once shutting down (or a scheduler died)."""
        return Response(status_code=200 if self.worker.serving else 503)

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
        ready = self.worker.serving
        return JSONResponse(
            {"status": "ready" if ready else "not ready"}, status_code=200 if ready else 503
        )

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__})


def _registry(worker: Worker, listener: Listener) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ConnectionCollector(listener.guard, rows.CONNECTION_METRICS))
    schedulers = {
        name: scheduler
        for name, scheduler in (
            ("embeddings", worker.embeddings),
            ("completions", worker.completions),
        )
        if scheduler is not None
    }
    kv_stats = None if worker.completions is None else ("completions", worker.completions.kv_stats)
    registry.register(
        WorkerCollector(
            schedulers, worker.policy, model_name=worker.config.model_name, kv_stats=kv_stats
        )
    )
    return registry


def _routes(handlers: Handlers, worker: Worker, listener: Listener) -> list[Route]:
    return [
        Route("/v1/embeddings", handlers.embeddings, methods=["POST"]),
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/v1/models/{model:path}", handlers.model, methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route(HEALTHZ_PATH, handlers.healthz, methods=["GET"]),
        Route(READYZ_PATH, handlers.readyz, methods=["GET"]),
        Route("/version", handlers.version, methods=["GET"]),
        Route(METRICS_PATH, metrics_endpoint(_registry(worker, listener)), methods=["GET"]),
    ]


class WorkerApp:
    """The served ASGI app (the middleware around the worker), with ``drain()`` for
    shutdown and the ``listener`` that ``gpuscope worker`` serves its connections under."""

    def __init__(self, asgi: ASGIApp, worker: Worker, listener: Listener) -> None:
        self._asgi = ConnectionTracking(asgi, listener.guard)
        self.worker = worker
        self.listener = listener

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._asgi(scope, receive, send)

    async def drain(self) -> None:
        await self.worker.drain()


def create_app(
    config: WorkerConfig,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    embedding_model: EmbeddingModel | None = None,
    generator: Generator | None = None,
    on_shutdown: Callable[[], None] | None = None,
) -> WorkerApp:
    """The worker as an ASGI app; serve it with uvicorn (lifespan on).

    ``embedding_model`` / ``generator`` replace the synthetic models (your own
    ``EmbeddingModel`` or ``Generator`` of ``model_api``, with the same schedulers);
    ``tracer_provider`` defaults to the global one. ``drain()`` (called on SIGTERM by
    ``gpuscope worker``) and lifespan shutdown both stop admitting, finish what the
    schedulers hold within ``config.shutdown_timeout_s`` and fail the rest with 503;
    then ``on_shutdown`` runs.
    """
    worker = build_worker(config, tracer_provider, embedding_model, generator)
    listener = Listener(config.max_connections, config.header_timeout_s, config.idle_timeout_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for scheduler in worker.schedulers():
            scheduler.start()
        try:
            yield
        finally:
            await worker.drain()
            worker.device.close()
            if on_shutdown is not None:
                on_shutdown()

    app = Starlette(
        routes=_routes(Handlers(worker), worker, listener),
        lifespan=lifespan,
        exception_handlers=dict(EXCEPTION_HANDLERS),
    )
    traced = GpuscopeMiddleware(
        app,
        tracer_provider=tracer_provider,
        service_name=None,
        excluded_paths=UNTRACED_PATHS,
        phase_spans=config.phase_spans,
    )
    return WorkerApp(traced, worker, listener)
