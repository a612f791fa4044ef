"""SIGTERM against a real worker process: drain, end what is left properly, exit 0."""

from __future__ import annotations

import asyncio
import json
import re
import signal

import httpx
import pytest

from support.worker_process import worker_process

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

MODEL = "gpuscope-synthetic"
SHORT, LONG = 10, 400  # at 50 ms per iteration: 0.5 s, and 20 s (past the 4 s timeout)


async def _stream(client: httpx.AsyncClient, max_tokens: int, started: asyncio.Event) -> list[str]:
    body = {"model": MODEL, "prompt": "story", "max_tokens": max_tokens, "stream": True}
    events = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                started.set()
    return events


async def _whole(client: httpx.AsyncClient, max_tokens: int) -> httpx.Response:
    body = {"model": MODEL, "prompt": "story", "max_tokens": max_tokens}
    return await client.post("/v1/completions", json=body)


async def _running(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    found = re.search(
        r'^gpuscope_worker_requests_running\{endpoint="completions"\} (\S+)$', text, re.M
    )
    assert found is not None
    return float(found.group(1))


async def test_worker_sigterm_lets_running_requests_finish_then_ends_the_rest() -> None:
    args = ["--batching", "continuous", "--max-batch-size", "8", "--shutdown-timeout-s", "4"]
    args += ["--max-new-tokens", str(LONG)]
    with worker_process(args, slow_step_ms=50) as worker:
        async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
            short_started, long_started = asyncio.Event(), asyncio.Event()
            short_stream = asyncio.create_task(_stream(client, SHORT, short_started))
            long_stream = asyncio.create_task(_stream(client, LONG, long_started))
            short_whole = asyncio.create_task(_whole(client, SHORT))
            long_whole = asyncio.create_task(_whole(client, LONG))
            await asyncio.wait_for(asyncio.gather(short_started.wait(), long_started.wait()), 30)
            for _ in range(1000):  # each check is a real scrape
                if await _running(client) == 4:
                    break
            assert not short_whole.done(), "the short request ended before SIGTERM"
            worker.process.send_signal(signal.SIGTERM)
            for _ in range(1000):
                if (await client.get("/readyz")).status_code == 503:
                    break
            refused = await _whole(client, SHORT)  # arrives while draining
            health = await client.get("/health")
            answers = await asyncio.gather(short_stream, long_stream, short_whole, long_whole)
        code = await asyncio.to_thread(worker.process.wait, 60)
    short_events, long_events, short_answer, long_answer = answers
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert health.status_code == 503
    # Admitted before SIGTERM and done within --shutdown-timeout-s: answered in full.
    assert short_events[-1] == "[DONE]" and len(short_events) == SHORT + 1
    assert short_answer.status_code == 200
    assert short_answer.json()["usage"]["completion_tokens"] == SHORT
    # Still running at the timeout: 503, and an error event ending the stream.
    assert long_answer.status_code == 503
    assert long_answer.json()["error"]["code"] == "shutting_down"
    last = json.loads(long_events[-1])
    assert last["error"]["code"] == "shutting_down" and "[DONE]" not in long_events
    assert 1 < len(long_events) < LONG
    assert code == 0, worker.output()
    assert "Traceback" not in worker.output() and "ERROR" not in worker.output()
