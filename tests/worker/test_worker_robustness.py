"""Overload, timeouts, disconnects and bad input against the worker on a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gpuscope.worker.backends import numpy_models
from support.span_recorder import SpanRecorder
from support.worker_servers import (
    SMALL,
    Gate,
    GatedEmbeddingModel,
    GatedGenerator,
    attrs,
    serve_worker,
)

MODEL = SMALL.model_name


async def test_worker_overload_answers_429_and_loses_no_accepted_request(
    span_recorder: SpanRecorder,
) -> None:
    gate = Gate()
    embedding, _ = numpy_models(SMALL)
    gate.close()  # the device will be busy: requests pile up in the queue
    with serve_worker(
        span_recorder,
        embedding_model=GatedEmbeddingModel(embedding, gate),
        batching="none",
        max_queue=3,
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            def embed(i: int) -> asyncio.Task[httpx.Response]:
                body = {"model": MODEL, "input": f"text {i}"}
                return asyncio.create_task(client.post("/v1/embeddings", json=body))

            first = embed(0)
            await asyncio.to_thread(gate.entered.wait, 10)  # it holds the device
            rest = [embed(i) for i in range(1, 12)]
            # Three fit in the queue; the other eight are answered at once, while the
            # device is still held.
            answered: set[asyncio.Task[httpx.Response]] = set()
            waiting = set(rest)
            while len(answered) < 8:
                done, waiting = await asyncio.wait(
                    waiting, timeout=10, return_when=asyncio.FIRST_COMPLETED
                )
                assert done, "refusals did not come at once"
                answered |= done
            assert len(answered) == 8 and len(waiting) == 3
            assert all(t.result().status_code == 429 for t in answered)
            gate.open()
            answers = await asyncio.gather(first, *rest)
            health = (await client.get("/healthz")).json()["embeddings"]
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 4 + [429] * 8
    for answer in answers:
        if answer.status_code == 429:
            assert int(answer.headers["retry-after"]) >= 1
            assert answer.json()["error"]["code"] == "queue_full"
        else:
            assert len(answer.json()["data"]) == 1
    assert health["rejected_queue_full"] == 8
    assert health["completed"] == 4


async def test_worker_request_timeout_answers_504(span_recorder: SpanRecorder) -> None:
    gate = Gate()
    embedding, _ = numpy_models(SMALL)
    gate.close()
    with serve_worker(
        span_recorder,
        embedding_model=GatedEmbeddingModel(embedding, gate),
        batching="none",
        request_timeout_s=0.2,
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            answer = await client.post("/v1/embeddings", json={"model": MODEL, "input": "late"})
            gate.open()
            health = (await client.get("/healthz")).json()["embeddings"]
            after = await client.post("/v1/embeddings", json={"model": MODEL, "input": "ok"})
    assert answer.status_code == 504
    assert answer.json()["error"]["code"] == "request_timeout"
    assert health["timed_out"] == 1
    assert after.status_code == 200  # the worker survived and serves the next one


async def test_worker_disconnected_stream_frees_its_slot(span_recorder: SpanRecorder) -> None:
    gate = Gate()
    _, generator = numpy_models(SMALL)
    with serve_worker(
        span_recorder,
        generator=GatedGenerator(generator, gate),
        batching="continuous",
        max_batch_size=1,  # one slot: the next request needs the abandoned one's
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": MODEL, "prompt": "abandoned", "max_tokens": 400, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        gate.close()  # mid-generation: it cannot finish on its own
                        break
            # The connection is closed; the server sees the disconnect.
            span_recorder.wait_for(lambda s: len(s.server_spans("/v1/completions")) == 1)
            gate.open()
            follow = {"model": MODEL, "prompt": "next", "max_tokens": 4}
            answer = await client.post("/v1/completions", json=follow)
            health = (await client.get("/healthz")).json()["completions"]
    assert answer.status_code == 200
    assert answer.json()["usage"]["completion_tokens"] == 4
    assert health["cancelled"] == 1
    abandoned = span_recorder.server_spans("/v1/completions")[0]
    found = attrs(abandoned)
    assert found["http.response.status_code"] == 499
    assert found["error.type"] == "client_disconnected"
    assert found["gen_ai.usage.output_tokens"] < 400


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/embeddings", b"{not json", 400, None),
        ("/v1/embeddings", b"[1, 2]", 400, None),
        ("/v1/embeddings", {"model": "other", "input": "x"}, 404, "model"),
        ("/v1/embeddings", {"model": MODEL}, 400, "input"),
        ("/v1/embeddings", {"model": MODEL, "input": ""}, 400, "input"),
        ("/v1/embeddings", {"model": MODEL, "input": [1, 99999]}, 400, "input"),
        ("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 0}, 400, "dimensions"),
        (
            "/v1/embeddings",
            {"model": MODEL, "input": "x", "encoding_format": "hex"},
            400,
            "encoding_format",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "max_tokens": 10_000},
            400,
            "max_tokens",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": 3}, 400, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": ["a"] * 17}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": [""]}, 400, "stop"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "stop": 7}, 400, "stop"),
        (
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "temperature": 0.7},
            400,
            "temperature",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "seed": "s"}, 400, "seed"),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
            400,
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages[0].content[0]",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 3},
            400,
            "n",
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "max_completion_tokens": 0,
            },
            400,
            "max_completion_tokens",
        ),
        ("/v1/embeddings", b'{"model": 1' + b"1" * 5000 + b"}", 400, None),
        ("/v1/embeddings", b"[" * 100_000, 400, None),
        ("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000, 400, None),
        ("/v1/completions", {"model": 7, "prompt": "x"}, 400, "model"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ],
)
async def test_worker_bad_requests_get_openai_errors(
    path: str, body: Any, status: int, param: str | None
) -> None:
    with serve_worker() as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            if isinstance(body, bytes):
                answer = await client.post(path, content=body)
            else:
                answer = await client.post(path, json=body)
            health = (await client.get("/healthz")).json()
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    assert health["embeddings"]["completed"] == health["completions"]["completed"] == 0


async def test_worker_unknown_route_and_method_get_openai_errors() -> None:
    with serve_worker() as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            missing = await client.get("/v1/chat/nothing")
            wrong_method = await client.get("/v1/embeddings")
            ready = await client.get("/readyz")
    assert missing.status_code == 404 and missing.json()["error"]["message"]
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"]
    assert ready.status_code == 200
