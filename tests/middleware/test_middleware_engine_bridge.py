"""The middleware in front of an engine that traces itself, as vLLM does.

The app below does what vLLM's OpenAI server does with a request: it reads the
propagation headers the middleware rewrote, starts its own ``llm_request`` SERVER span
under them on the same SDK provider, with the attributes a real vLLM set (replayed
from the captured fixture), and answers in OpenAI's shape without ever telling
gpuscope the model.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gpuscope import engine_spans
from gpuscope.middleware import GpuscopeMiddleware, current_timeline, stats
from support.span_recorder import SpanRecorder
from support.vllm_fixtures import llm_request_attributes

CAPTURED = llm_request_attributes()[0]


def engine_app(provider: TracerProvider, attributes: dict[str, Any] = CAPTURED) -> Starlette:
    tracer = provider.get_tracer("vllm.tracing.otel")

    def trace_like_vllm(request: Request) -> None:
        headers = {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}
        context = TraceContextTextMapPropagator().extract(headers)
        span = tracer.start_span(
            "llm_request", context=context, kind=SpanKind.SERVER, start_time=time.time_ns()
        )
        span.set_attributes(attributes)
        span.end()

    async def completions(request: Request) -> Response:
        await request.body()
        trace_like_vllm(request)
        return JSONResponse(
            {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny"}
        )

    async def chat_stream(request: Request) -> Response:
        async def chunks() -> Any:
            yield b'data: {"object":"chat.completion.chunk","created":1,"model":"tiny"}\n\n'
            trace_like_vllm(request)  # the engine finishes before the last chunk goes out
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_stream, methods=["POST"]),
        ]
    )


async def post(app: Any, path: str) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://vllm"
    ) as client:
        return await client.post(path, json={"model": "tiny", "prompt": "x"})


def by_name(recorder: SpanRecorder) -> dict[str, Any]:
    return {span.name: span for span in recorder.exporter.get_finished_spans()}


async def test_engine_phases_ride_on_the_server_span_and_the_engine_span_is_marked(
    span_recorder: SpanRecorder,
) -> None:
    provider = span_recorder.provider
    app = GpuscopeMiddleware(engine_app(provider), tracer_provider=provider)
    assert (await post(app, "/v1/completions")).status_code == 200

    spans = by_name(span_recorder)
    server, engine = spans["POST /v1/completions"], spans["llm_request"]
    assert engine.parent.span_id == server.context.span_id  # one trace per request
    assert engine.context.trace_id == server.context.trace_id
    assert engine.attributes[engine_spans.COUNTED_BY_SERVER_SPAN] is True
    attrs = dict(server.attributes)
    assert attrs["gpuscope.queue.duration"] == CAPTURED["gen_ai.latency.time_in_queue"]
    assert attrs["gpuscope.compute.duration"] == CAPTURED["gen_ai.latency.time_in_model_inference"]
    assert attrs["gpuscope.compute.prefill.duration"] == CAPTURED[engine_spans.VLLM_PREFILL]
    assert attrs["gpuscope.compute.decode.duration"] == CAPTURED[engine_spans.VLLM_DECODE]
    assert attrs["gen_ai.usage.output_tokens"] == CAPTURED["gen_ai.usage.completion_tokens"]
    assert attrs["gpuscope.time_to_first_token"] == CAPTURED[engine_spans.VLLM_TTFT]
    assert "gpuscope.batch_wait.duration" not in attrs  # the engine has none: absent
    # The model and operation come from the response, the engine never names them.
    assert attrs["gen_ai.request.model"] == "tiny"
    assert attrs["gen_ai.operation.name"] == "text_completion"


async def test_streamed_responses_are_paired_too(span_recorder: SpanRecorder) -> None:
    provider = span_recorder.provider
    app = GpuscopeMiddleware(engine_app(provider), tracer_provider=provider)
    response = await post(app, "/v1/chat/completions")
    assert response.text.endswith("[DONE]\n\n")
    attrs = dict(by_name(span_recorder)["POST /v1/chat/completions"].attributes)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gpuscope.queue.duration"] == CAPTURED["gen_ai.latency.time_in_queue"]


async def test_an_engine_span_outside_any_request_is_left_alone(
    span_recorder: SpanRecorder,
) -> None:
    provider = span_recorder.provider
    GpuscopeMiddleware(engine_app(provider), tracer_provider=provider)
    span = provider.get_tracer("vllm").start_span("llm_request", kind=SpanKind.SERVER)
    span.end()
    (engine,) = span_recorder.exporter.get_finished_spans()
    assert engine_spans.COUNTED_BY_SERVER_SPAN not in (engine.attributes or {})


async def test_marks_set_by_the_app_win_over_the_engine_report(span_recorder: SpanRecorder) -> None:
    provider = span_recorder.provider
    inner = engine_app(provider)
    seen: list[Any] = []

    async def marking(scope: Any, receive: Any, send: Any) -> None:
        timeline = current_timeline()
        assert timeline is not None
        seen.append(timeline)
        timeline.enqueued()
        timeline.admitted()
        timeline.set_model("app-model")
        await inner(scope, receive, send)

    app = GpuscopeMiddleware(marking, tracer_provider=provider)
    await post(app, "/v1/completions")
    attrs = dict(by_name(span_recorder)["POST /v1/completions"].attributes)
    assert attrs["gpuscope.queue.duration"] == seen[0].phase_seconds()["queue"]
    assert attrs["gen_ai.request.model"] == "app-model"
    assert attrs["gpuscope.compute.duration"] == CAPTURED["gen_ai.latency.time_in_model_inference"]


async def test_an_engine_span_with_bad_values_is_counted_and_the_request_still_served(
    span_recorder: SpanRecorder,
) -> None:
    stats.reset()
    provider = span_recorder.provider
    broken = CAPTURED | {engine_spans.VLLM_QUEUE: -1.0}
    app = GpuscopeMiddleware(engine_app(provider, broken), tracer_provider=provider)
    assert (await post(app, "/v1/completions")).status_code == 200
    attrs = dict(by_name(span_recorder)["POST /v1/completions"].attributes)
    assert "gpuscope.queue.duration" not in attrs
    assert stats.snapshot()["engine_span"] == 1
