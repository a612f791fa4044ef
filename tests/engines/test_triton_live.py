"""The engine rules on a real Triton Inference Server: run by ``make triton-check``.

PyTriton (``nvidia-pytriton`` 0.7.0, which bundles ``tritonserver`` 2.51.0) serves three
NumPy models with a known handler time and Triton's dynamic batcher
(``scripts/engines/triton_models.py``): ``steady``; ``failing``, whose batches fail when
they hold a request asking to (every tenth); ``cached``, with the response cache on and
every input sent twice, a pass apart. A real Prometheus scrapes Triton's metrics port as job
``triton`` with the shipped rules (built with a 1 s evaluation interval), and every
recorded ``source="triton"`` series is checked against what the models logged and the
client saw (``support.triton_engine.check_recorded``).

With ``GPUSCOPE_TRITON_CAPTURE=DIR`` the expositions before, during and after the load
and the truth are written to ``DIR``: the fixtures ``make test`` replays
(tests/alerts/test_alerts_triton_replay.py). Skipped unless ``GPUSCOPE_TRITON_PYTHON``
names the Triton venv's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support.prometheus_server import (
    instant_query,
    run_prometheus,
    scrapes_done,
    wait_for_evaluations,
    wait_for_scrapes,
)
from support.triton_engine import (
    CAPTURE_VARIABLE,
    MODELS,
    REPO,
    TritonServer,
    check_recorded,
    drive,
    launch_triton,
    model_truth,
    recorded,
    scalar,
    triton_python,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        triton_python() is None, reason="GPUSCOPE_TRITON_PYTHON unset (make triton-check)"
    ),
]

# the bounded load: requests per model and clients at a time
LOAD = {"steady": (1200, 8), "failing": (600, 4), "cached": (600, 4)}


def values(model: str, count: int) -> list[float]:
    if model == "failing":  # every tenth asks its batch to fail
        return [-1.0 if i % 10 == 9 else float(i) for i in range(count)]
    if model == "cached":  # every input twice, a pass apart: the second pass hits
        return [float(i % (count // 2)) for i in range(count)]
    return [float(i) for i in range(count)]


def build_rules(out: Path) -> list[Path]:
    """The shipped rules, evaluated every second instead of every 30 s."""
    command = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(out)]
    subprocess.run([*command, "--interval", "1s"], check=True, capture_output=True)
    return sorted(out.glob("*.yml"))


def write_capture(capture: Path, expositions: list[str], truth: dict[str, Any]) -> None:
    capture.mkdir(parents=True, exist_ok=True)
    for index, text in enumerate(expositions):
        (capture / f"metrics-{index}.txt").write_text(text)
    (capture / "truth.json").write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")


async def metrics_text(session: aiohttp.ClientSession, port: int) -> str:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        return await response.text()


async def settled(session: aiohttp.ClientSession, base: str, successes: int) -> None:
    """Until Prometheus holds the last counts and the rules have evaluated over them."""
    query = 'sum(nv_inference_request_success{job="triton"})'
    deadline = time.monotonic() + 30
    while (await scalar(session, base, query) or 0) < successes:
        assert time.monotonic() < deadline, "Prometheus never saw the last requests"
        await asyncio.sleep(0.2)
    await wait_for_scrapes(session, base, await scrapes_done(session, base) + 2)
    await wait_for_evaluations(session, base, time.time())  # over those scrapes


def test_every_recorded_triton_series_matches_what_the_models_did(tmp_path: Path) -> None:
    python = triton_python()
    assert python is not None
    capture = os.environ.get(CAPTURE_VARIABLE)
    started = time.monotonic()
    with launch_triton(python, tmp_path) as triton:
        asyncio.run(run(triton, tmp_path, Path(capture) if capture else None))
    print(f"whole check: {time.monotonic() - started:.0f} s")


async def run(triton: TritonServer, work: Path, capture: Path | None) -> None:
    rules = build_rules(work / "rules")
    target = f"127.0.0.1:{triton.metrics_port}"
    async with (
        run_prometheus([target], work, job="triton", rule_files=rules) as base,
        aiohttp.ClientSession() as session,
    ):
        await wait_for_scrapes(session, base, 3)
        expositions = [await metrics_text(session, triton.metrics_port)]
        load = asyncio.gather(
            *(
                drive(session, triton.http, model, values(model, count), clients)
                for model, (count, clients) in LOAD.items()
            )
        )
        loaded = time.monotonic()
        await asyncio.sleep(3)  # timed: an exposition three seconds into the load
        expositions.append(await metrics_text(session, triton.metrics_port))
        replies = [reply for replies in await load for reply in replies]
        print(f"load: {len(replies)} requests in {time.monotonic() - loaded:.1f} s")
        truth = {model: model_truth(triton.log_dir, model, replies) for model in MODELS}
        await settled(session, base, sum(t["succeeded"] for t in truth.values()))
        expositions.append(await metrics_text(session, triton.metrics_port))
        waiting = await instant_query(
            session,
            base,
            'instance_endpoint:gpuscope_worker_requests_waiting:avg5m{source="triton"}',
        )
        problems = []
        for model in MODELS:
            got = await recorded(session, base, model)
            frontend = truth[model]["client_latency_mean_s"] - (got["request"] or 0)
            print(
                f"{model}: {json.dumps(truth[model])}\n  recorded: "
                + json.dumps({k: v for k, v in got.items() if k != "verdict"})
                + f"\n  HTTP frontend (client mean - Triton request mean): {frontend * 1e3:.2f} ms"
            )
            problems += check_recorded(model, got, truth[model])
    if capture is not None:
        write_capture(capture, expositions, truth)
    assert len(waiting) == 1 and 0 <= float(waiting[0]["value"][1]) <= 16, waiting
    assert problems == [], "\n".join(problems)
