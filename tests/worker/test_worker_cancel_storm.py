"""Clients that give up while the paged cache preempts: over real sockets, every
key/value block comes back and the scheduler's gauges return to zero."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.worker.backends import numpy_models
from support.waiting import await_until
from support.worker_servers import SMALL, Gate, GatedGenerator, serve_worker

MODEL = SMALL.model_name
# 128 positions: two long sequences overflow it.
CONFIG = replace(SMALL, kv_cache_blocks=8, kv_block_size=16)


def _gauges(text: str) -> dict[str, float]:
    wanted = {
        "gpuscope_worker_kv_cache_blocks_used",
        "gpuscope_worker_requests_running",
        "gpuscope_worker_requests_waiting",
        "gpuscope_worker_preemptions_total",
    }
    found: dict[str, float] = {"gave_up": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("endpoint") == "embeddings":
                continue
            if sample.name in wanted:
                found[sample.name] = sample.value
            elif sample.name == "gpuscope_worker_requests_total" and sample.labels.get(
                "outcome"
            ) in ("cancelled", "timed_out"):
                found["gave_up"] += sample.value
    return found


async def _stream_then_leave(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return  # one event, then the connection closes


async def _give_up(client: httpx.AsyncClient, body: dict[str, Any], after_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.post("/v1/completions", json=body), after_s)


@pytest.mark.slow  # a storm of seconds: left out of the fast tier
async def test_worker_cancel_storm_during_preemption_frees_every_block() -> None:
    rng = random.Random(7)
    gate = Gate()
    _, generator = numpy_models(CONFIG)
    with serve_worker(
        generator=GatedGenerator(generator, gate),
        batching="continuous",
        max_batch_size=8,
        kv_cache_blocks=CONFIG.kv_cache_blocks,
        kv_block_size=CONFIG.kv_block_size,
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            gate.close()  # everything below is queued before the first step runs
            first = {"model": MODEL, "prompt": "hold", "max_tokens": 60}
            held = asyncio.create_task(client.post("/v1/completions", json=first))
            await asyncio.to_thread(gate.entered.wait, 10)
            work: list[Coroutine[Any, Any, object]] = []
            sequences = {"stay": 0, "leave": 0}  # by whether the client may leave early
            for i in range(48):
                prompts = [[65 + i % 20] * rng.randint(20, 50) for _ in range(1 + i % 3)]
                body = {"model": MODEL, "prompt": prompts, "max_tokens": 60}
                sequences["leave" if i % 3 == 1 else "stay"] += len(prompts)
                if i % 3 == 0:
                    work.append(_stream_then_leave(client, {**body, "stream": True}))
                elif i % 3 == 1:
                    work.append(_give_up(client, body, rng.uniform(0.05, 1.0)))
                else:
                    work.append(client.post("/v1/completions", json=body))
            tasks = [asyncio.ensure_future(w) for w in work]
            leavers = tasks[1::3]

            async def all_queued() -> bool:
                # Every sequence waits for the gate or has left; a leaver that gave up before
                # it was queued is counted nowhere, so once they all left, the others suffice.
                now = _gauges((await client.get("/metrics")).text)
                waiting = now["gpuscope_worker_requests_waiting"]
                if waiting + now["gave_up"] >= sequences["stay"] + sequences["leave"]:
                    return True
                return all(t.done() for t in leavers) and waiting >= sequences["stay"]

            await await_until(all_queued, "the storm's requests queued behind the gate", 30)
            gate.open()
            results = await asyncio.wait_for(asyncio.gather(held, *tasks), 120)

            async def blocks_freed() -> dict[str, float]:
                # the last leavers are noticed at the next iteration
                now = _gauges((await client.get("/metrics")).text)
                return now if now["gpuscope_worker_kv_cache_blocks_used"] == 0 else {}

            after = await await_until(blocks_freed, "every key/value block back", 10)
            follow = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    answered = [r for r in results if isinstance(r, httpx.Response)]
    assert answered and all(r.status_code == 200 for r in answered)
    assert after["gpuscope_worker_preemptions_total"] > 0  # the storm hit a full cache
    assert after["gpuscope_worker_kv_cache_blocks_used"] == 0
    assert after["gpuscope_worker_requests_running"] == 0
    assert after["gpuscope_worker_requests_waiting"] == 0
    assert follow.status_code == 200
