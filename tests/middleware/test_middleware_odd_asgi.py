"""GpuscopeMiddleware against odd ASGI traffic: buggy apps, odd responses, failing servers."""

from __future__ import annotations

from typing import Any

import pytest

from gpuscope.middleware import GpuscopeMiddleware, current_timeline, stats
from gpuscope.middleware.types import Message, Receive, Scope, Send
from support.middleware_asgi import call, http_scope
from support.span_recorder import SpanRecorder


def attributes(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


class StrictServer:
    """A server ``send`` that refuses a second ``http.response.start``, as uvicorn does."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if self.started:
                raise RuntimeError("response already started")
            self.started = True
        self.sent.append(message)


async def receive_once() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def test_a_second_response_start_keeps_the_status_the_client_got(
    span_recorder: SpanRecorder,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.start", "status": 404, "headers": []})

    server = StrictServer()
    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider)
    with pytest.raises(RuntimeError, match="already started"):
        await wrapped(http_scope(), receive_once, server.send)
    assert [m["status"] for m in server.sent] == [200]  # what went out on the wire
    attrs = attributes(span_recorder.spans()[0])
    assert attrs["http.response.status_code"] == 200
    assert attrs["error.type"] == "RuntimeError"


@pytest.mark.parametrize(
    ("method", "status", "body_message"),
    [
        ("HEAD", 200, {"type": "http.response.body", "body": b""}),
        ("GET", 204, {"type": "http.response.body"}),  # no body key, more_body omitted
        ("GET", 304, {"type": "http.response.body", "more_body": False}),
    ],
)
async def test_bodiless_responses_finish_on_their_only_body_message(
    span_recorder: SpanRecorder, method: str, status: int, body_message: Message
) -> None:
    after_response: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        timeline = current_timeline()
        assert timeline is not None
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send(body_message)
        after_response.append(timeline.duration_seconds() is not None)

    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider)
    sent = await call(wrapped, http_scope(method=method))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert after_response == [True]  # the span ended on the body message, not on return
    (server,) = span_recorder.server_spans()
    assert attributes(server)["http.response.status_code"] == status
    assert attributes(server)["http.request.method"] == method


async def test_trailers_after_the_last_body_chunk_pass_through(
    span_recorder: SpanRecorder,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [], "trailers": True})
        await send({"type": "http.response.body", "body": b"ok"})
        await send({"type": "http.response.trailers", "headers": [], "more_trailers": False})

    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider)
    sent = await call(wrapped, http_scope())
    assert [m["type"] for m in sent][-1] == "http.response.trailers"
    assert attributes(span_recorder.server_spans()[0])["http.response.status_code"] == 200


async def test_an_oserror_from_the_server_send_is_a_client_disconnect(
    span_recorder: SpanRecorder,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            raise ConnectionResetError("peer went away")

    wrapped = GpuscopeMiddleware(app, tracer_provider=span_recorder.provider)
    with pytest.raises(ConnectionResetError):
        await wrapped(http_scope(), receive_once, send)
    attrs = attributes(span_recorder.spans()[0])
    assert attrs["http.response.status_code"] == 499
    assert attrs["error.type"] == "client_disconnected"
    assert stats.snapshot().get("server_span_end", 0) == 0
