"""The runner reads an engine's own ``/metrics`` around the same requests as its
server-side view (``Target.engine_url``), against a small aiohttp app on 127.0.0.1 that
answers completions and counts them in vLLM's histograms: the warm-up's requests are in
neither view, each step's are in both, and the scrapes bounding each step are kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from gpuscope.loadgen.engine_metrics import VLLM_E2E, VLLM_INFERENCE, VLLM_QUEUE
from gpuscope.loadgen.results import Load
from gpuscope.loadgen.runner import Plan, Runner, Target
from gpuscope.loadgen.workload import Lengths, synthetic_requests

WARM_QUEUE_S, QUEUE_S, INFERENCE_S = 5.0, 0.1, 0.2


@dataclass
class Engine:
    url: str = ""
    warm: bool = True  # requests answered now are the warm-up's
    view_scrapes: int = 0
    queued: list[float] = field(default_factory=list)


def exposition(queued: list[float], factor: float) -> str:
    """vLLM's three request histograms over the requests answered so far; ``factor``
    scales the times, as a view that counts them differently would."""
    n = len(queued)
    lines = []
    for name, total in (
        (VLLM_E2E, sum(queued) + n * INFERENCE_S),
        (VLLM_QUEUE, sum(queued)),
        (VLLM_INFERENCE, n * INFERENCE_S),
    ):
        labels = 'engine="0",model_name="m"'
        lines += [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{{labels},le="+Inf"}} {n}',
            f"{name}_count{{{labels}}} {n}",
            f"{name}_sum{{{labels}}} {total * factor}",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    state = Engine()

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        state.queued.append(WARM_QUEUE_S if state.warm else QUEUE_S)
        await asyncio.sleep(0.01)  # timed: the engine's compute
        return web.json_response(
            {"choices": [{"text": "ab", "index": 0}], "usage": {"completion_tokens": 2}}
        )

    async def view(request: web.Request) -> web.StreamResponse:
        # the runner scrapes this before the warm-up, then once the warm-up's requests
        # have all ended: every request after that is a measured one
        state.view_scrapes += 1
        state.warm = state.view_scrapes < 2
        return web.Response(text=exposition(state.queued, 1.0), content_type="text/plain")

    async def own(request: web.Request) -> web.StreamResponse:
        return web.Response(text=exposition(state.queued, 1.02), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/view/metrics", view)
    app.router.add_get("/metrics", own)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    state.url = f"http://{host}:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


async def test_the_engine_view_counts_each_steps_requests_and_not_the_warm_up(
    engine: Engine, tmp_path: Path
) -> None:
    plan = Plan((Load("concurrency", 2), Load("concurrency", 1)), duration_s=60, requests=6,
                warmup_s=0.3)  # fmt: skip
    specs = synthetic_requests(
        {"completions": 1.0}, Lengths("fixed", (1,)), Lengths("fixed", (2,)), 0
    )
    target = Target(
        f"{engine.url}/v1", f"{engine.url}/view", metrics_format="vllm",
        engine_url=engine.url, engine_format="vllm", engine_dump=tmp_path / "kept",
    )  # fmt: skip
    results = await Runner(plan, target, specs, asyncio.Event()).run()
    warm = len(engine.queued) - sum(r.ok for r in results)
    assert warm > 0 and engine.queued[:warm] == [WARM_QUEUE_S] * warm
    for result in results:
        assert result.server is not None and result.engine is not None
        # exactly the step's requests on both sides: a warm-up request in either would
        # move its queue mean by seconds
        assert result.ok == result.server.requests == result.engine.requests
        assert result.server.phase_mean_ms == pytest.approx(
            {"queue": QUEUE_S * 1000, "compute": INFERENCE_S * 1000}
        )
        assert result.engine.phase_mean_ms == pytest.approx(
            {"queue": QUEUE_S * 1020, "compute": INFERENCE_S * 1020}
        )
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == [f"step-{i}-{w}.prom" for i in (1, 2) for w in ("after", "before")]
    first = (tmp_path / "kept" / "step-1-before.prom").read_text()
    assert f'{VLLM_E2E}_count{{engine="0",model_name="m"}} {warm}\n' in first
