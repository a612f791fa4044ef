"""GpuscopeMiddleware behind a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gpuscope.middleware import GpuscopeMiddleware, current_timeline
from support.servers import run_uvicorn
from support.span_recorder import SpanRecorder

CHUNKS = 32


async def stream_tokens(request: Request) -> StreamingResponse:
    count = int(request.query_params.get("n", CHUNKS))
    pause = float(request.query_params.get("pause", 0))
    timeline = current_timeline()
    assert timeline is not None

    async def tokens() -> AsyncIterator[bytes]:
        for i in range(count):
            if i == 0:
                timeline.first_token()
            timeline.add_output_tokens(1)
            yield f"data: token-{i}\n\n".encode()
            await asyncio.sleep(pause)

    return StreamingResponse(tokens(), media_type="text/event-stream")


def streaming_app(recorder: SpanRecorder) -> GpuscopeMiddleware:
    app = Starlette(routes=[Route("/v1/stream", stream_tokens)])
    return GpuscopeMiddleware(app, tracer_provider=recorder.provider)


def test_a_streamed_response_is_one_span_never_one_per_chunk(
    span_recorder: SpanRecorder,
) -> None:
    with run_uvicorn(streaming_app(span_recorder)) as url:
        with httpx.stream("GET", f"{url}/v1/stream", timeout=10) as response:
            body = b"".join(response.iter_bytes())
        spans = span_recorder.wait_for(lambda r: len(r.spans()) >= 1)
    assert body == b"".join(f"data: token-{i}\n\n".encode() for i in range(CHUNKS))
    assert [span.name for span in spans] == ["GET /v1/stream"]
    attrs: dict[str, Any] = dict(spans[0].attributes or {})
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.usage.output_tokens"] == CHUNKS
    assert 0 < attrs["gpuscope.time_to_first_token"] < 10
    assert 0 <= attrs["gpuscope.time_per_output_token"] < attrs["gpuscope.time_to_first_token"] + 1


def test_a_client_that_disconnects_mid_stream_is_recorded(span_recorder: SpanRecorder) -> None:
    with run_uvicorn(streaming_app(span_recorder)) as url:
        with httpx.stream("GET", f"{url}/v1/stream?n=2000&pause=0.005", timeout=10) as response:
            for received, _ in enumerate(response.iter_bytes(), start=1):
                if received == 3:
                    break  # leaving the block closes the connection mid-stream
        spans = span_recorder.wait_for(lambda r: len(r.spans()) >= 1)
    attrs: dict[str, Any] = dict(spans[0].attributes or {})
    assert attrs["http.response.status_code"] == 499
    assert attrs["error.type"] == "client_disconnected"
    assert attrs["gen_ai.usage.output_tokens"] < 2000


async def test_concurrent_requests_through_uvicorn_each_get_their_own_span(
    span_recorder: SpanRecorder,
) -> None:
    with run_uvicorn(streaming_app(span_recorder)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            sizes = [1, 5, 9, 13, 17, 21, 25, 29]
            responses = await asyncio.gather(
                *(client.get(f"/v1/stream?n={n}&pause=0.001") for n in sizes)
            )
        assert all(r.status_code == 200 for r in responses)
        spans = span_recorder.wait_for(lambda r: len(r.spans()) >= len(sizes))
    tokens = sorted((s.attributes or {})["gen_ai.usage.output_tokens"] for s in spans)  # type: ignore[type-var]
    assert tokens == sizes
