"""A FastAPI app as a user already runs it, served by ``python -m support.user_stack_app``.

It sets its own global ``TracerProvider`` (a 50 % ratio sampler, parent-based) after
wrapping itself in the gpuscope middleware, as an app built at import time and
configured at startup does; it is served under a root path and has a 204, a stream,
a background task and a websocket. ``GET /_spans`` (untraced) tells the test what the
provider recorded. Its own process, because OpenTelemetry's global provider can be
set only once per process. Prints the port it listens on, then serves.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import BackgroundTasks, FastAPI, WebSocket
from fastapi.responses import Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from gpuscope.middleware import GpuscopeMiddleware, stats

ROOT_PATH = "/api"
BACKGROUND_S = 0.5

app = FastAPI()
finished_background: list[float] = []
exporter = InMemorySpanExporter()


@app.get("/items/{item_id}")
async def item(item_id: int) -> dict[str, int]:
    return {"id": item_id}


@app.get("/empty")
async def empty() -> Response:
    return Response(status_code=204)


@app.get("/stream")
async def stream() -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        for i in range(3):
            await asyncio.sleep(0.01)
            yield f"{i}\n"

    return StreamingResponse(lines())


@app.get("/background")
async def background(tasks: BackgroundTasks) -> dict[str, bool]:
    async def slow() -> None:
        await asyncio.sleep(BACKGROUND_S)  # timed: background work after the response
        finished_background.append(BACKGROUND_S)

    tasks.add_task(slow)
    return {"queued": True}


@app.websocket("/ws")
async def echo(sock: WebSocket) -> None:
    await sock.accept()
    async for text in sock.iter_text():
        await sock.send_text(text.upper())


@app.get("/_spans")
async def spans() -> dict[str, Any]:
    ours = [
        span
        for span in exporter.get_finished_spans()
        if span.instrumentation_scope is not None
        and span.instrumentation_scope.name == "gpuscope"
        and span.kind == trace.SpanKind.SERVER
    ]
    return {
        "spans": [
            {
                "name": span.name,
                "path": (span.attributes or {}).get("url.path"),
                "route": (span.attributes or {}).get("http.route"),
                "status": (span.attributes or {}).get("http.response.status_code"),
                "trace_id": format(span.context.trace_id, "032x") if span.context else "",
                "duration_s": ((span.end_time or 0) - (span.start_time or 0)) / 1e9,
            }
            for span in ours
        ],
        "sampled_out": stats.snapshot()["requests_sampled_out"],
        "background_done": len(finished_background),
    }


served = GpuscopeMiddleware(app, excluded_paths=(f"{ROOT_PATH}/_spans",))
provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.5)))
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(served, root_path=ROOT_PATH, log_level="warning", ws="websockets")
    uvicorn.Server(config).run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
