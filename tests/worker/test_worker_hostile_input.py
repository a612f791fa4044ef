"""Hostile but well-formed JSON and stalled bodies against the worker on a real server:
every one is answered in OpenAI's error shape, and the worker serves the next request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx
import pytest

from gpuscope.worker.backends import numpy_models
from gpuscope.worker.kv_cache import BlockPool, SequenceState
from gpuscope.worker.model_api import FloatArray, Generator
from support.raw_http import raw_exchange, status_of
from support.worker_servers import SMALL, Gate, GatedGenerator, serve_worker

MODEL = SMALL.model_name
LONE_SURROGATE = "\ud800"  # valid JSON ("\\ud800"), not encodable as UTF-8


def _chat(content: Any = "hi", role: Any = "user") -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": role, "content": content}], "max_tokens": 2}


HOSTILE = [
    ("/v1/completions", {"model": MODEL, "prompt": LONE_SURROGATE, "max_tokens": 2}, 400),
    ("/v1/completions", {"model": MODEL, "prompt": ["ok", LONE_SURROGATE]}, 400),
    ("/v1/completions", {"model": LONE_SURROGATE, "prompt": "hi"}, 404),
    ("/v1/chat/completions", _chat(content=f"a{LONE_SURROGATE}b"), 400),
    ("/v1/chat/completions", _chat(content=[{"type": "text", "text": LONE_SURROGATE}]), 400),
    ("/v1/chat/completions", _chat(role=["user"]), 400),
    ("/v1/chat/completions", _chat(role={"user": 1}), 400),
    ("/v1/embeddings", {"model": MODEL, "input": LONE_SURROGATE}, 400),
    ("/v1/embeddings", {"model": MODEL, "input": ["x", LONE_SURROGATE]}, 400),
]


@pytest.mark.parametrize(("path", "body", "status"), HOSTILE)
async def test_worker_hostile_json_values_get_openai_errors(
    path: str, body: dict[str, Any], status: int
) -> None:
    raw = json.dumps(body)  # ASCII with \\ud800 escapes, as a client would send it
    with serve_worker() as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            headers = {"content-type": "application/json"}
            answer = await client.post(path, content=raw, headers=headers)
            after = await client.post(path.replace("chat/", ""), json=_valid(path))
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert after.status_code == 200  # the same server, still serving


def _valid(path: str) -> dict[str, Any]:
    if path == "/v1/embeddings":
        return {"model": MODEL, "input": "fine"}
    return {"model": MODEL, "prompt": "fine", "max_tokens": 2}


@pytest.mark.parametrize(
    "request_bytes",
    [
        # A declared length never reached.
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
        # A chunked body whose last chunk never comes.
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
    ],
    ids=["short-content-length", "unterminated-chunked"],
)
async def test_worker_stalled_body_gets_408_after_the_request_timeout(
    request_bytes: bytes,
) -> None:
    with serve_worker(request_timeout_s=0.5) as url:
        host, port = url.removeprefix("http://").split(":")
        # The client keeps its half open: only the server's timeout can end this.
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(request_bytes)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 20)
        finally:
            writer.close()
        health = await raw_exchange(
            host, int(port), b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert status_of(answer) == 408
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert status_of(health) == 200


class _BrokenGenerator:
    """A plug-in model with a bug: ``start`` raises what no handler expects."""

    def __init__(self, inner: Generator) -> None:
        self._inner = inner

    @property
    def max_context(self) -> int:
        return self._inner.max_context

    @property
    def kv_pool(self) -> BlockPool:
        return self._inner.kv_pool

    def start(self, prompt: Sequence[int]) -> SequenceState:
        raise RuntimeError("a bug in the plug-in")

    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        return self._inner.step(sequences)


async def test_worker_unexpected_error_is_a_500_in_openai_shape() -> None:
    _, generator = numpy_models(SMALL)
    with serve_worker(generator=_BrokenGenerator(generator)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            answer = await client.post("/v1/completions", json=_valid("/v1/completions"))
            health = await client.get("/healthz")
    assert answer.status_code == 500
    assert answer.json()["error"]["type"] == "server_error"
    assert health.status_code == 200


@pytest.mark.parametrize(
    ("prompts", "status", "counter"),
    [
        # Room for two more sequences in the queue, three asked for at once.
        (["a", "b", "c"], 429, "rejected_queue_full"),
        # The third prompt can never fit in the cache (BOS + 100 + 32 - 1 > 128).
        ([[65] * 10, [65] * 10, [65] * 100], 400, None),
    ],
    ids=["queue-full", "third-prompt-too-long-for-the-cache"],
)
async def test_worker_refused_multi_prompt_request_counts_once_and_queues_nothing(
    prompts: list[Any], status: int, counter: str | None
) -> None:
    gate = Gate()
    _, generator = numpy_models(replace(SMALL, kv_cache_blocks=8, kv_block_size=16))
    with serve_worker(
        generator=GatedGenerator(generator, gate),
        batching="none",
        max_queue=3,
        kv_cache_blocks=8,
        kv_block_size=16,
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            gate.close()
            body = {"model": MODEL, "prompt": "busy", "max_tokens": 4}
            busy = asyncio.create_task(client.post("/v1/completions", json=body))
            await asyncio.to_thread(gate.entered.wait, 10)  # it holds the device
            waiting = asyncio.create_task(client.post("/v1/completions", json=body))
            for _ in range(400):  # it takes one of the three places in the queue
                if (await client.get("/healthz")).json()["completions"]["queued"] == 1:
                    break
                await asyncio.sleep(0.025)
            many = {"model": MODEL, "prompt": prompts, "max_tokens": 32}
            refused = await client.post("/v1/completions", json=many)
            health = (await client.get("/healthz")).json()["completions"]
            gate.open()
            assert (await busy).status_code == (await waiting).status_code == 200
    assert refused.status_code == status, refused.text
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    assert health["queued"] == 1  # only the request that was already waiting
    assert health["cancelled"] == 0  # nothing was queued, so nothing was withdrawn
    if counter is not None:
        assert health[counter] == 1


class _FailsOnceGenerator(_BrokenGenerator):
    """A plug-in whose ``step`` raises once, at its ``fail_at``-th call (a device fault)."""

    def __init__(self, inner: Generator, fail_at: int) -> None:
        super().__init__(inner)
        self._calls = 0
        self._fail_at = fail_at

    def start(self, prompt: Sequence[int]) -> SequenceState:
        return self._inner.start(prompt)

    def step(self, sequences: Sequence[SequenceState]) -> list[int]:
        self._calls += 1
        if self._calls == self._fail_at:
            raise RuntimeError("device fault")
        return self._inner.step(sequences)


@pytest.mark.parametrize("batching", ["continuous", "static"])
async def test_worker_model_failure_mid_stream_ends_with_an_error_event(batching: str) -> None:
    _, generator = numpy_models(SMALL)
    with serve_worker(
        generator=_FailsOnceGenerator(generator, fail_at=4), batching=batching
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": MODEL, "prompt": "go", "max_tokens": 20, "stream": True}
            streamed = await client.post("/v1/completions", json=body)
            after = await client.post("/v1/completions", json={**body, "stream": False})
            metrics = (await client.get("/metrics")).text
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert streamed.status_code == 200
    assert len(events) >= 2 and events[-1] != "[DONE]"
    error = json.loads(events[-1])["error"]
    assert error["type"] == "server_error" and error["code"] == "model_error"
    assert after.status_code == 200  # the scheduler survived the fault
    assert 'outcome="failed"} 1.0' in metrics
    assert "gpuscope_worker_kv_cache_blocks_used 0.0" in metrics


async def test_worker_model_failure_is_a_500_in_openai_shape() -> None:
    _, generator = numpy_models(SMALL)
    with serve_worker(generator=_FailsOnceGenerator(generator, fail_at=2)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": MODEL, "prompt": "go", "max_tokens": 20}
            failed = await client.post("/v1/completions", json=body)
            after = await client.post("/v1/completions", json=body)
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "model_error"
    assert after.status_code == 200


class _FailingEmbedder:
    """A plug-in embedding model whose forward pass raises (a device fault)."""

    dimensions = 8

    def embed(self, batch: Sequence[Sequence[int]]) -> FloatArray:
        raise RuntimeError("device fault")


async def test_worker_embedding_model_failure_is_a_500_in_openai_shape() -> None:
    with serve_worker(embedding_model=_FailingEmbedder()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            failed = await client.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
            health = (await client.get("/healthz")).json()["embeddings"]
    assert failed.status_code == 500
    assert failed.json()["error"]["code"] == "model_error"
    assert health["failed"] == 1


async def test_worker_more_prompts_than_the_whole_queue_is_a_400_not_a_retry() -> None:
    with serve_worker(max_queue=2) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": MODEL, "prompt": ["a", "b", "c"], "max_tokens": 2}
            refused = await client.post("/v1/completions", json=body)
            fits = await client.post("/v1/completions", json={**body, "prompt": ["a", "b"]})
            health = (await client.get("/healthz")).json()["completions"]
    # 429 would invite a retry that can never succeed.
    assert refused.status_code == 400
    assert "retry-after" not in refused.headers
    assert refused.json()["error"]["param"] == "prompt"
    assert fits.status_code == 200
    assert health["rejected_queue_full"] == 0
