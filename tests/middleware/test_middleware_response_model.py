"""What the middleware reads from a response, and from which: the ``model`` label only
from successful answers (an error body may echo the client's request), and the
operation from the response's ``"object"`` and the route together."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuscope import spans
from gpuscope.middleware import GpuscopeMiddleware, response_fields
from support.span_recorder import SpanRecorder
from support.worker_servers import serve_worker


class CompletionRequest(BaseModel):
    model: str
    prompt: str


def completions_api() -> FastAPI:
    """A FastAPI app that never sets the model: the middleware reads it from answers."""
    api = FastAPI()

    @api.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        return {"id": "cmpl-1", "object": "text_completion", "model": "served", "choices": []}

    return api


async def test_models_echoed_by_fastapis_422_are_never_read(span_recorder: SpanRecorder) -> None:
    app = GpuscopeMiddleware(completions_api(), tracer_provider=span_recorder.provider)
    invented = [f"invented-{i}" for i in range(300)]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as client:
        for name in invented:  # no prompt: FastAPI answers 422, echoing the body
            answer = await client.post("/v1/completions", json={"model": name})
            assert answer.status_code == 422
            assert name in answer.text  # the body does name it, within the sniffed KiB
            assert answer.text.index(name) < response_fields.SNIFF_BYTES
        served = await client.post("/v1/completions", json={"model": "x", "prompt": "hi"})
        assert served.status_code == 200
    servers = span_recorder.server_spans()
    assert len(servers) == 301
    rejected = [dict(span.attributes or {}) for span in servers[:-1]]
    assert all(attributes[spans.HTTP_RESPONSE_STATUS_CODE] == 422 for attributes in rejected)
    assert not [a for a in rejected if spans.GEN_AI_REQUEST_MODEL in a]
    assert not [a for a in rejected if spans.GEN_AI_RESPONSE_MODEL in a]
    answered = dict(servers[-1].attributes or {})
    assert answered[spans.GEN_AI_REQUEST_MODEL] == "served"  # a 2xx is still read
    assert answered[spans.GEN_AI_OPERATION_NAME] == "text_completion"


@pytest.mark.parametrize("status", [201, 299])
async def test_every_successful_status_is_read(span_recorder: SpanRecorder, status: int) -> None:
    async def created(request: Request) -> Response:
        return JSONResponse({"object": "chat.completion", "model": "m"}, status_code=status)

    app = GpuscopeMiddleware(
        Starlette(routes=[Route("/c", created)]), tracer_provider=span_recorder.provider
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        await c.get("/c")
    (server,) = span_recorder.server_spans()
    assert dict(server.attributes or {})[spans.GEN_AI_REQUEST_MODEL] == "m"


@pytest.mark.parametrize("status", [199, 300, 404, 500])
async def test_no_other_status_is_read(span_recorder: SpanRecorder, status: int) -> None:
    async def answer(request: Request) -> Response:
        return JSONResponse({"object": "chat.completion", "model": "m"}, status_code=status)

    app = GpuscopeMiddleware(
        Starlette(routes=[Route("/c", answer)]), tracer_provider=span_recorder.provider
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        await c.get("/c")
    (server,) = span_recorder.server_spans()
    attributes = dict(server.attributes or {})
    assert spans.GEN_AI_REQUEST_MODEL not in attributes
    assert spans.GEN_AI_OPERATION_NAME not in attributes


def test_the_real_workers_model_list_is_no_embeddings_request(span_recorder: SpanRecorder) -> None:
    with serve_worker(span_recorder) as url:
        listed = httpx.get(f"{url}/v1/models", timeout=5)
        assert listed.status_code == 200 and listed.json()["object"] == "list"
        model = listed.json()["data"][0]["id"]
        embedded = httpx.post(
            f"{url}/v1/embeddings", json={"model": model, "input": "hello"}, timeout=10
        )
        assert embedded.status_code == 200 and embedded.json()["object"] == "list"
    span_recorder.wait_for(lambda recorder: len(recorder.server_spans()) == 2)
    models = dict(span_recorder.server_spans("/v1/models")[0].attributes or {})
    assert spans.GEN_AI_OPERATION_NAME not in models  # unknown stays unknown
    embeddings = dict(span_recorder.server_spans("/v1/embeddings")[0].attributes or {})
    assert embeddings[spans.GEN_AI_OPERATION_NAME] == "embeddings"


async def test_a_list_names_embeddings_by_its_route_or_its_items(
    span_recorder: SpanRecorder,
) -> None:
    """An app that sets nothing itself: the list on an embeddings route, or holding
    embedding objects, is embeddings; a list of models anywhere is not."""

    async def embedding_list(request: Request) -> Response:
        return JSONResponse({"object": "list", "model": "emb", "data": []})

    async def model_list(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def embeddings_elsewhere(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}]}
        )

    app = GpuscopeMiddleware(
        Starlette(
            routes=[
                Route("/v1/embeddings", embedding_list, methods=["POST"]),
                Route("/v1/models", model_list),
                Route("/embed", embeddings_elsewhere, methods=["POST"]),
            ]
        ),
        tracer_provider=span_recorder.provider,
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        await c.post("/v1/embeddings", json={})
        await c.get("/v1/models")
        await c.post("/embed", json={})
    operations = {
        dict(s.attributes or {})[spans.HTTP_ROUTE]: dict(s.attributes or {}).get(
            spans.GEN_AI_OPERATION_NAME
        )
        for s in span_recorder.server_spans()
    }
    assert operations == {
        "/v1/embeddings": "embeddings",
        "/v1/models": None,
        "/embed": "embeddings",
    }


@pytest.mark.parametrize(
    ("body", "route", "operation"),
    [
        (b'{"object":"list","data":[{"id":"m","object":"model"}]}', "/v1/models", None),
        (b'{"object":"list","data":[]}', None, None),
        (b'{"object":"list","data":[]}', "/v1/embeddings", "embeddings"),
        (b'{"object":"list","data":[]}', "/openai/v1/embeddings/", "embeddings"),
        (b'{"object":"list","data":[{"object":"embedding","index":0}]}', None, "embeddings"),
        (b'{"object":"list","data":[]}', "/v1/embeddings-admin", None),
        (b'{"object":"chat.completion"}', "/v1/embeddings", "chat"),  # the object decides
    ],
)
def test_list_operation_from_route_and_items(
    body: bytes, route: str | None, operation: str | None
) -> None:
    assert response_fields.read(body, route).operation == operation
