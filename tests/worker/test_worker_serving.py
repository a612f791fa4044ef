"""The worker on a real uvicorn server: batching modes, phases in spans, SSE, the openai client."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from gpuscope.worker.backends import numpy_models
from support.span_recorder import SpanRecorder
from support.worker_servers import SMALL, Gate, GatedGenerator, attrs, serve_worker

MODEL = SMALL.model_name
PHASES = ("preprocess", "queue", "batch_wait", "compute", "postprocess")


async def _embed(client: httpx.AsyncClient, text: str) -> httpx.Response:
    return await client.post("/v1/embeddings", json={"model": MODEL, "input": text})


async def _complete(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
    return await client.post("/v1/completions", json=body)


@pytest.mark.parametrize("mode", ["none", "static", "dynamic", "continuous"])
async def test_worker_every_mode_serves_concurrent_requests(
    mode: str, span_recorder: SpanRecorder
) -> None:
    embedding_model, _ = numpy_models(SMALL)
    texts = [f"request number {i}" for i in range(12)]
    with serve_worker(span_recorder, batching=mode, max_batch_size=4) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            embeds = [_embed(client, text) for text in texts]
            completes = [_complete(client, text, 5) for text in texts]
            answers = await asyncio.gather(*embeds, *completes)
    assert [a.status_code for a in answers] == [200] * 24
    for text, answer in zip(texts, answers[:12], strict=True):
        expected = embedding_model.embed([list(text.encode())])[0]
        got = np.asarray(answer.json()["data"][0]["embedding"], dtype=np.float32)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    for answer in answers[12:]:
        body = answer.json()
        assert body["usage"]["completion_tokens"] == 5
        assert len(body["choices"][0]["text"]) == 5
    sizes = [attrs(s)["gpuscope.batch.size"] for s in span_recorder.batches()]
    assert max(sizes) <= (1 if mode == "none" else 4)


async def test_worker_dynamic_batches_share_and_phases_add_up(span_recorder: SpanRecorder) -> None:
    with serve_worker(
        span_recorder, batching="dynamic", max_batch_size=8, max_queue_delay_ms=5
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            answers = await asyncio.gather(*(_embed(client, f"text {i}") for i in range(16)))
    assert all(a.status_code == 200 for a in answers)
    span_recorder.wait_for(lambda s: len(s.server_spans("/v1/embeddings")) == 16)
    servers = span_recorder.server_spans("/v1/embeddings")
    batch_of: Counter[Any] = Counter()
    for span in servers:
        found = attrs(span)
        assert span.name == "POST /v1/embeddings"
        phase_sum = sum(found[f"gpuscope.{phase}.duration"] for phase in PHASES)  # all five set
        duration = (span.end_time - span.start_time) / 1e9  # type: ignore[operator]
        assert phase_sum == pytest.approx(duration, abs=2e-6)
        assert found["gen_ai.operation.name"] == "embeddings"
        assert found["gen_ai.request.model"] == MODEL
        batch_of[found["gpuscope.batch.id"]] += 1
    assert len(batch_of) < 16, "concurrent requests never shared a batch"
    batches = {attrs(s)["gpuscope.batch.id"]: s for s in span_recorder.batches()}
    for batch_id, members in batch_of.items():
        batch = batches[batch_id]
        assert attrs(batch)["gpuscope.batch.size"] == members
        assert len(batch.links) == members
        assert attrs(batch)["gpuscope.batch.trigger"] in ("full", "timeout")
    for span in servers:
        found = attrs(span)
        assert found["gpuscope.batch.size"] == batch_of[found["gpuscope.batch.id"]]


async def _stream_events(
    client: httpx.AsyncClient, prompt: str, max_tokens: int, started: asyncio.Event | None = None
) -> list[str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    events: list[str] = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                if started is not None:
                    started.set()
    return events


@pytest.mark.parametrize("mode", ["continuous", "static"])
async def test_worker_newcomer_joins_running_generation_only_when_continuous(
    mode: str, span_recorder: SpanRecorder
) -> None:
    gate = Gate()
    _, generator = numpy_models(SMALL)
    gated = GatedGenerator(generator, gate)
    with serve_worker(span_recorder, generator=gated, batching=mode, max_batch_size=4) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            long_started = asyncio.Event()
            long_task = asyncio.create_task(
                _stream_events(client, "a long story", 440, long_started)
            )
            await long_started.wait()
            gate.close()  # the long sequence is mid-generation and cannot finish
            short_task = asyncio.create_task(_stream_events(client, "short", 3))
            for _ in range(2000):  # each check is a real request to the worker
                health = (await client.get("/healthz")).json()
                if health["completions"]["queued"] == 1:
                    break
            gate.open()
            long_events, short_events = await asyncio.gather(long_task, short_task)
    assert long_events[-1] == "[DONE]" and short_events[-1] == "[DONE]"
    assert len(long_events) == 441
    chunks = [json.loads(e) for e in short_events[:-1]]
    assert len(chunks) == 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    span_recorder.wait_for(lambda s: len(s.server_spans("/v1/completions")) == 2)
    by_tokens = {
        attrs(s)["gen_ai.usage.output_tokens"]: s
        for s in span_recorder.server_spans("/v1/completions")
    }
    long_span, short_span = by_tokens[440], by_tokens[3]
    short = attrs(short_span)
    assert short["gpuscope.time_to_first_token"] > 0
    batches = {attrs(s)["gpuscope.batch.id"]: s for s in span_recorder.batches()}
    short_batch = batches[short["gpuscope.batch.id"]]
    long_batch = batches[attrs(long_span)["gpuscope.batch.id"]]
    if mode == "continuous":
        # Joined the running batch at the next iteration and left long before the other.
        assert {attrs(b)["gpuscope.batch.trigger"] for b in batches.values()} == {"iteration"}
        assert short["gpuscope.batch.size"] == 2
        assert short_span.end_time < long_span.end_time  # type: ignore[operator]
    else:
        # Waited in the queue until the whole running batch had finished.
        assert short["gpuscope.batch.size"] == 1
        assert short_batch.start_time >= long_batch.end_time  # type: ignore[operator]


async def test_worker_serves_the_official_openai_client(span_recorder: SpanRecorder) -> None:
    with serve_worker(span_recorder, batching="continuous") as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        embedded = await client.embeddings.create(model=MODEL, input=["one", "two"])
        assert len(embedded.data) == 2
        assert len(embedded.data[0].embedding) == SMALL.hidden_size
        assert embedded.usage.prompt_tokens == 6
        completion = await client.completions.create(model=MODEL, prompt="hi", max_tokens=7)
        assert completion.usage is not None and completion.usage.completion_tokens == 7
        stream = await client.completions.create(
            model=MODEL,
            prompt="hi",
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
        )
        texts: list[str] = []
        usage = None
        async for chunk in stream:
            texts += [choice.text for choice in chunk.choices]
            usage = chunk.usage or usage
        assert "".join(texts) == completion.choices[0].text
        assert usage is not None and usage.completion_tokens == 7
        with pytest.raises(openai.NotFoundError) as missing:
            await client.completions.create(model="no-such-model", prompt="hi")
        assert missing.value.code == "model_not_found"
        await client.close()
