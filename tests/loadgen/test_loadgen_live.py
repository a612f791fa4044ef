"""The load generator against real servers on 127.0.0.1: the reference worker and the
exporter as child processes (``gpuscope worker`` / ``gpuscope exporter``), or the worker
in this process where a test must hold its device (a gated model)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from gpuscope.children import Children, free_port, simulated_gpu_uuid
from gpuscope.loadgen.results import Load, StepResult
from gpuscope.loadgen.runner import Live, Plan, Runner, Target
from gpuscope.loadgen.workload import Lengths, parse_mix, synthetic_requests
from gpuscope.spans import PHASES
from gpuscope.worker.backends import numpy_models
from support.worker_servers import SMALL, Gate, GatedEmbeddingModel, serve_worker

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

SMALL_WORKER: dict[str, Any] = {"hidden_size": 64, "layers": 1, "log_level": "warning"}


@dataclass(frozen=True)
class Stack:
    worker_url: str  # http://127.0.0.1:PORT
    exporter_url: str

    @property
    def openai_url(self) -> str:
        return self.worker_url + "/v1"


async def start_stack(children: Children, *, tracing: bool = True) -> Stack:
    if not tracing:
        worker = children.worker(no_tracing=True, **SMALL_WORKER)
        await worker.wait_ready()
        return Stack(worker.url, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    exporter = children.simulated_exporter()
    await exporter.wait_ready()
    worker = children.worker(
        otlp_endpoint=exporter.traces_url, gpu_uuid=simulated_gpu_uuid(0), **SMALL_WORKER
    )
    await worker.wait_ready()
    return Stack(worker.url, exporter.url)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Children() as children:
        yield asyncio.run(start_stack(children))


def specs(mix: str = "embeddings=1,completions=1,completions-stream=1", seed: int = 0) -> Any:
    return synthetic_requests(
        parse_mix(mix.split(",")), Lengths("uniform", (2, 8)), Lengths("fixed", (6,)), seed
    )


async def run(plan: Plan, target: Target, mix: str = "embeddings=1", **kw: Any) -> list[StepResult]:
    return await Runner(plan, target, specs(mix), asyncio.Event(), **kw).run()


async def worker_completed(worker_url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{worker_url}/healthz") as reply:
        body = await reply.json()
    return int(body["embeddings"]["completed"] + body["completions"]["completed"])


async def test_loadgen_worker_and_exporter_count_the_same_requests(stack: Stack) -> None:
    served_before = await worker_completed(stack.worker_url)
    plan = Plan((Load("concurrency", 2), Load("concurrency", 4)), 120, requests=12, warmup_s=0)
    mix = "embeddings=1,completions=1,completions-stream=1"
    results = await run(plan, Target(stack.openai_url, stack.exporter_url), mix)
    assert [(r.sent, r.ok, r.errors) for r in results] == [(12, 12, {}), (12, 12, {})]
    assert await worker_completed(stack.worker_url) - served_before == 24
    for result in results:
        assert result.server is not None
        assert result.server.requests == 12
        assert set(result.server.phase_mean_ms) == set(PHASES)
        assert sum(result.server.phase_mean_share.values()) == pytest.approx(1)
        # each phase's P99 against the same requests' end-to-end P99 (bucket
        # interpolation can put a phase a little past it, never far)
        assert set(result.server.phase_p99_share) == set(PHASES)
        assert all(0 < share <= 1.1 for share in result.server.phase_p99_share.values())
        assert result.server.batch_size_mean is not None and result.server.batch_size_mean >= 1
        assert result.server.pcie_bytes_per_s is not None
        assert result.ttft_ms["p50"] > 0 and result.tpot_ms["p50"] > 0
        assert result.tokens_per_s > 0
        assert set(result.by_kind) <= {"embeddings", "completions", "completions-stream"}


async def test_chat_is_measured_when_served_and_a_404_is_reported_when_not(stack: Stack) -> None:
    plan = Plan((Load("concurrency", 2),), 60, requests=4, warmup_s=0)
    (result,) = await run(plan, Target(stack.openai_url), "chat-stream=1")
    assert result.sent == 4
    if result.errors == {"status 404": 4}:
        assert result.notes == [
            "404 from chat-stream (/chat/completions): the server does not serve that endpoint"
        ]
    else:
        assert result.ok == 4, result.errors
        assert result.ttft_ms["p50"] > 0


async def test_429s_are_reported_as_errors_not_hidden() -> None:
    gate = Gate()
    embedding, _ = numpy_models(SMALL)
    gate.close()  # the device holds the first request; the queue takes one more
    with serve_worker(
        embedding_model=GatedEmbeddingModel(embedding, gate), batching="none", max_queue=1
    ) as url:

        async def open_after_refusals() -> None:
            async with aiohttp.ClientSession() as session:
                for _ in range(300):
                    async with session.get(f"{url}/healthz") as reply:
                        if (await reply.json())["embeddings"]["rejected_queue_full"] >= 6:
                            break
                    await asyncio.sleep(0.1)
            gate.open()

        opener = asyncio.create_task(open_after_refusals())
        plan = Plan((Load("concurrency", 8),), 60, requests=16, warmup_s=0)
        (result,) = await run(plan, Target(url + "/v1"))
        await opener
    assert result.sent == 16
    assert result.errors["status 429"] >= 6
    assert result.ok + sum(result.errors.values()) == 16
    assert result.ok >= 2
    assert "p99" in result.latency_ms  # measured over the successes only


async def test_a_worker_killed_mid_step_shows_as_connection_errors() -> None:
    with Children() as children:
        stack = await start_stack(children, tracing=False)
        worker = children.processes["worker"]

        def kill_after_some(live: Live) -> None:
            if len(live.outcomes) >= 5 and worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)

        # bounded by count: once the worker is gone, refused connections come fast
        plan = Plan((Load("concurrency", 4),), 60, requests=1500, warmup_s=0)
        mix = "embeddings=1,completions-stream=1"
        (result,) = await run(plan, Target(stack.openai_url, model="gpuscope-synthetic"), mix,
                              tick=kill_after_some)  # fmt: skip
    assert worker.poll() is not None
    assert result.ok >= 5
    assert result.errors.get("connection", 0) + result.errors.get("stream", 0) > 0
    assert result.ok + sum(result.errors.values()) == result.sent == 1500


async def test_open_loop_counts_missed_sends_under_overload() -> None:
    gate = Gate()
    embedding, _ = numpy_models(SMALL)
    gate.close()  # nothing completes: two open requests fill the client's window

    def open_once_overloaded(live: Live) -> None:
        if live.missed >= 50:
            gate.open()

    with serve_worker(embedding_model=GatedEmbeddingModel(embedding, gate)) as url:
        plan = Plan((Load("rate", 200),), 1.0, warmup_s=0, max_in_flight=2, arrival="constant")
        (result,) = await run(plan, Target(url + "/v1"), tick=open_once_overloaded)
        gate.open()
    assert result.missed >= 50
    assert any("with --max-in-flight requests open" in note for note in result.notes)
    assert result.sent >= 2 and result.ok == result.sent
    # every arrival of the schedule was either sent or counted as missed
    assert result.sent + result.missed == 200  # 201 when 1/rate was added up
