"""GpuscopeMiddleware in-process: spans, phases, routes, errors and pass-through."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route

from gpuscope.middleware import GpuscopeMiddleware, current_timeline, stats
from gpuscope.middleware.timeline import COMPUTED
from gpuscope.middleware.types import Message, Receive, Scope, Send
from support.middleware_asgi import call, http_scope
from support.span_recorder import SpanRecorder


async def phased_app(scope: Scope, receive: Receive, send: Send) -> None:
    """A raw ASGI app that marks every phase, like a batching server would."""
    timeline = current_timeline()
    assert timeline is not None
    await receive()
    timeline.set_model("mlp")
    timeline.set_operation("embeddings")
    timeline.set_tokens(input_tokens=7)
    for mark in (timeline.enqueued, timeline.admitted, timeline.dispatched, timeline.computed):
        await asyncio.sleep(0.002)
        mark()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def attributes(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_server_span_carries_phases_that_add_up(span_recorder: SpanRecorder) -> None:
    app = GpuscopeMiddleware(phased_app, tracer_provider=span_recorder.provider)
    sent = await call(app, http_scope("/v1/embeddings", "POST"))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]

    (server,) = span_recorder.server_spans()
    attrs = attributes(server)
    assert server.name == "POST"  # no router, no route: never the raw path
    assert server.kind is SpanKind.SERVER
    assert attrs["http.request.method"] == "POST"
    assert attrs["url.path"] == "/v1/embeddings"
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.request.model"] == "mlp"
    assert attrs["gen_ai.operation.name"] == "embeddings"
    assert attrs["gen_ai.usage.input_tokens"] == 7
    phases = [f"gpuscope.{p}.duration" for p in ("queue", "batch_wait", "compute")]
    assert all(attrs[key] >= 0.0015 for key in phases)
    total = sum(
        attrs[f"gpuscope.{p}.duration"]
        for p in ("preprocess", "queue", "batch_wait", "compute", "postprocess")
    )
    assert server.start_time is not None and server.end_time is not None
    assert total == pytest.approx((server.end_time - server.start_time) / 1e9, abs=2e-6)


async def test_phase_spans_start_and_end_exactly_at_the_marks(
    span_recorder: SpanRecorder,
) -> None:
    app = GpuscopeMiddleware(phased_app, tracer_provider=span_recorder.provider, phase_spans=True)
    await call(app, http_scope("/", "POST"))
    (server,) = span_recorder.server_spans()
    children = {span.name: span for span in span_recorder.children_of(server)}
    assert set(children) == {"gpuscope.queue", "gpuscope.batch_wait", "gpuscope.compute"}
    queue, wait, compute = (children[f"gpuscope.{p}"] for p in ("queue", "batch_wait", "compute"))
    assert queue.end_time == wait.start_time
    assert wait.end_time == compute.start_time
    attrs = attributes(server)
    for phase, span in (("queue", queue), ("batch_wait", wait), ("compute", compute)):
        assert span.kind is SpanKind.INTERNAL
        assert span.context.trace_id == server.context.trace_id
        assert span.end_time is not None and span.start_time is not None
        seconds = (span.end_time - span.start_time) / 1e9
        assert seconds == pytest.approx(attrs[f"gpuscope.{phase}.duration"], abs=1e-9)


async def test_a_request_without_marks_still_gets_a_correct_span(
    span_recorder: SpanRecorder,
) -> None:
    async def plain(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    await call(GpuscopeMiddleware(plain, tracer_provider=span_recorder.provider), http_scope())
    (server,) = span_recorder.spans()
    attrs = attributes(server)
    assert attrs["http.response.status_code"] == 204
    assert not [key for key in attrs if key.startswith("gpuscope.")]
    assert server.status.status_code is StatusCode.UNSET


async def test_starlette_route_templates_name_the_span(span_recorder: SpanRecorder) -> None:
    async def item(request: Request) -> PlainTextResponse:
        return PlainTextResponse(request.path_params["item_id"])

    starlette = Starlette(
        routes=[Route("/items/{item_id}", item), Mount("/v2", routes=[Route("/x/{item_id}", item)])]
    )
    app = GpuscopeMiddleware(starlette, tracer_provider=span_recorder.provider)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/items/41")).text == "41"
        assert (await client.get("/items/42")).text == "42"
        assert (await client.get("/v2/x/43")).text == "43"
        assert (await client.get("/nowhere/at/all")).status_code == 404
    names = [span.name for span in span_recorder.server_spans()]
    assert names == ["GET /items/{item_id}", "GET /items/{item_id}", "GET /v2/x/{item_id}", "GET"]
    routes = [attributes(s).get("http.route") for s in span_recorder.server_spans()]
    assert routes == ["/items/{item_id}", "/items/{item_id}", "/v2/x/{item_id}", None]


async def test_fastapi_route_templates_name_the_span(span_recorder: SpanRecorder) -> None:
    api = FastAPI()

    @api.get("/models/{model_id}")
    async def model(model_id: str) -> dict[str, str]:
        return {"id": model_id}

    outer = Starlette(routes=[Mount("/api", app=api)])
    app = GpuscopeMiddleware(outer, tracer_provider=span_recorder.provider)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/api/models/m1")).json() == {"id": "m1"}
    (server,) = span_recorder.server_spans()
    assert server.name == "GET /api/models/{model_id}"


async def test_interleaved_requests_never_swap_attributes(span_recorder: SpanRecorder) -> None:
    first_started = asyncio.Event()
    second_done = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        timeline = current_timeline()
        assert timeline is not None
        name = scope["path"].strip("/")
        timeline.set_model(name)
        if name == "first":
            first_started.set()
            await second_done.wait()  # the second request runs start to finish meanwhile
        else:
            await first_started.wait()
        status = 201 if name == "first" else 202
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": name.encode()})
        if name == "second":
            second_done.set()

    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider)
    await asyncio.gather(call(wrapped, http_scope("/first")), call(wrapped, http_scope("/second")))
    by_path = {attributes(s)["url.path"]: attributes(s) for s in span_recorder.server_spans()}
    assert by_path["/first"]["gen_ai.request.model"] == "first"
    assert by_path["/first"]["http.response.status_code"] == 201
    assert by_path["/second"]["gen_ai.request.model"] == "second"
    assert by_path["/second"]["http.response.status_code"] == 202


async def test_an_exception_propagates_unchanged_and_is_recorded(
    span_recorder: SpanRecorder,
) -> None:
    class ModelExploded(RuntimeError):
        pass

    boom = ModelExploded("no more memory")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise boom

    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider)
    with pytest.raises(ModelExploded) as raised:
        await call(wrapped, http_scope())
    assert raised.value is boom
    (server,) = span_recorder.spans()
    attrs = attributes(server)
    assert attrs["http.response.status_code"] == 500
    assert (
        attrs["error.type"]
        == "test_an_exception_propagates_unchanged_and_is_recorded.<locals>.ModelExploded"
    )
    assert server.status.status_code is StatusCode.ERROR
    assert [event.name for event in server.events] == ["exception"]


async def test_an_exception_after_the_response_started_keeps_its_status(
    span_recorder: SpanRecorder,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"par", "more_body": True})
        raise ValueError("stream broke")

    with pytest.raises(ValueError, match="stream broke"):
        await call(GpuscopeMiddleware(app, tracer_provider=span_recorder.provider), http_scope())
    attrs = attributes(span_recorder.spans()[0])
    assert attrs["http.response.status_code"] == 200
    assert attrs["error.type"] == "ValueError"


async def test_background_tasks_after_the_response_are_not_counted(
    span_recorder: SpanRecorder,
) -> None:
    background_started_ns: list[int] = []

    async def slow_cleanup() -> None:
        background_started_ns.append(time.time_ns())
        await asyncio.sleep(0.05)  # timed: cleanup after the response

    async def endpoint(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True}, background=BackgroundTask(slow_cleanup))

    app = GpuscopeMiddleware(
        Starlette(routes=[Route("/", endpoint)]), tracer_provider=span_recorder.provider
    )
    await call(app, http_scope())
    (server,) = span_recorder.server_spans()
    assert server.end_time is not None
    assert server.end_time <= background_started_ns[0]


async def test_websocket_and_lifespan_scopes_pass_through_untouched(
    span_recorder: SpanRecorder,
) -> None:
    seen: list[tuple[Scope, Receive, Send]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((scope, receive, send))

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider)
    for kind in ("lifespan", "websocket"):
        scope: dict[str, Any] = {"type": kind, "path": "/ws"}
        await wrapped(scope, receive, send)
        assert seen[-1] == (scope, receive, send)
        assert seen[-1][0] is scope and seen[-1][1] is receive and seen[-1][2] is send
    assert span_recorder.spans() == []


async def test_excluded_paths_are_not_traced(span_recorder: SpanRecorder) -> None:
    seen: list[object] = []

    async def health(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(current_timeline())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = GpuscopeMiddleware(
        health, tracer_provider=span_recorder.provider, excluded_paths=["/healthz"]
    )
    await call(app, http_scope("/healthz"))
    assert seen == [None]
    assert span_recorder.spans() == []
    await call(app, http_scope("/v1/embeddings"))
    assert len(span_recorder.server_spans()) == 1


async def test_incoming_traceparent_becomes_the_parent(span_recorder: SpanRecorder) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    header = f"00-{trace_id}-b7ad6b7169203331-01".encode()
    app = GpuscopeMiddleware(phased_app, tracer_provider=span_recorder.provider)
    await call(app, http_scope(headers=[(b"traceparent", header)]))
    (server,) = span_recorder.server_spans()
    assert format(server.context.trace_id, "032x") == trace_id
    assert server.parent is not None and format(server.parent.span_id, "016x") == "b7ad6b7169203331"


async def test_broken_hooks_are_counted_never_raised(span_recorder: SpanRecorder) -> None:
    def broken(*args: object) -> None:
        raise KeyError("hook bug")

    app = GpuscopeMiddleware(
        phased_app,
        tracer_provider=span_recorder.provider,
        request_hook=broken,
        response_hook=broken,
    )
    sent = await call(app, http_scope())
    assert sent[0]["status"] == 200
    assert stats.snapshot()["request_hook"] == 1
    assert stats.snapshot()["response_hook"] == 1
    assert len(span_recorder.server_spans()) == 1


async def test_a_broken_tracer_never_fails_the_request() -> None:
    class ExplodingTracer:
        def start_span(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("tracing backend is down")

    stats.reset()
    app = GpuscopeMiddleware(phased_app)
    app.tracer = ExplodingTracer()  # type: ignore[assignment]
    sent = await call(app, http_scope())
    assert sent[1]["body"] == b"ok"  # and phased_app found its timeline
    counts = stats.snapshot()
    assert counts["server_span_start"] == 1
    assert counts["requests_sampled_out"] == 0  # not also counted as sampled out


async def test_sampled_out_requests_are_counted() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    stats.reset()
    app = GpuscopeMiddleware(phased_app, tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
    sent = await call(app, http_scope())
    assert sent[1]["body"] == b"ok"
    assert stats.snapshot()["requests_sampled_out"] == 1


async def test_marks_after_the_response_do_not_touch_the_span(span_recorder: SpanRecorder) -> None:
    kept: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kept.append(current_timeline())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    await call(GpuscopeMiddleware(app, tracer_provider=span_recorder.provider), http_scope())
    kept[0].computed()
    assert kept[0].mark_ns(COMPUTED) is None
    assert current_timeline() is None  # the contextvar was reset after the request


async def test_an_app_that_never_responds_is_recorded_as_the_500_servers_send(
    span_recorder: SpanRecorder,
) -> None:
    async def silent(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()

    await call(GpuscopeMiddleware(silent, tracer_provider=span_recorder.provider), http_scope())
    (server,) = span_recorder.spans()
    attrs = attributes(server)
    assert attrs["http.response.status_code"] == 500
    assert attrs["error.type"] == "no_response"
    assert server.status.status_code is StatusCode.ERROR


@pytest.mark.parametrize("failing", ["extract", "inject"])
async def test_a_broken_propagator_never_fails_the_request(
    span_recorder: SpanRecorder, failing: str
) -> None:
    from opentelemetry import propagate
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import TextMapPropagator

    class BrokenPropagator(TextMapPropagator):
        def extract(self, carrier: Any, context: Context | None = None, getter: Any = None) -> Any:
            if failing == "extract":
                raise RuntimeError("cannot read headers")
            return context if context is not None else Context()

        def inject(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("cannot write headers")

        @property
        def fields(self) -> set[str]:
            return {"traceparent"}

    stats.reset()
    original = propagate.get_global_textmap()
    propagate.set_global_textmap(BrokenPropagator())
    try:
        app = GpuscopeMiddleware(phased_app, tracer_provider=span_recorder.provider)
        sent = await call(app, http_scope())
    finally:
        propagate.set_global_textmap(original)
    assert sent[1]["body"] == b"ok"
    counts = stats.snapshot()
    if failing == "extract":  # served untraced
        assert counts["server_span_start"] == 1
    else:  # traced; the app sees the caller's headers unchanged
        assert counts["propagation_headers"] == 1
        assert len(span_recorder.server_spans()) == 1
