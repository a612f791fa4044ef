"""Triton's ``/metrics`` replayed for a real Prometheus: the expositions ``make
triton-check`` captured from the running server (``tests/fixtures/triton-2.51/
metrics-<n>.txt``: before, during and after the load), served one after the other,
each for a few scrapes, the last one from then on. Rates over a window that holds the
whole replay are then the capture's increases, so every ratio the rules record (a mean,
a share, a batch size) is the live run's.

    async with run_triton_replay() as url:   # http://127.0.0.1:PORT, serving /metrics
        ...
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from support.prometheus_server import run_prometheus, wait_for_evaluations, wait_for_scrapes
from support.servers import serve_aiohttp
from support.triton_engine import MODELS, REPO, scalar

FIXTURES = Path(__file__).parents[1] / "fixtures" / "triton-2.51"
SCRAPES_EACH = 3


def captures(folder: Path = FIXTURES) -> list[str]:
    paths = sorted(folder.glob("metrics-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    return [path.read_text() for path in paths]


def truth(folder: Path = FIXTURES) -> dict[str, Any]:
    """What the models logged and the client saw in that run, per model."""
    loaded: dict[str, Any] = json.loads((folder / "truth.json").read_text())
    return loaded


@asynccontextmanager
async def run_triton_replay(folder: Path = FIXTURES) -> AsyncIterator[str]:
    """Serve the captures in order on ``/metrics`` of a loopback port; yields the base URL."""
    texts = await asyncio.to_thread(captures, folder)
    scrapes = 0

    async def metrics(request: web.Request) -> web.Response:
        nonlocal scrapes
        text = texts[min(scrapes // SCRAPES_EACH, len(texts) - 1)]
        scrapes += 1
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serve_aiohttp(app, access_log=None) as url:
        yield url


@asynccontextmanager
async def rules_over_the_replay(
    tmp_path: Path,
) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """A real Prometheus scraping the replay as job ``triton`` with the rules built at a
    1 s interval, once its rules have evaluated over the last capture: (session, its
    base URL)."""
    out = tmp_path / "rules"
    build = [sys.executable, str(REPO / "alerts" / "build.py"), "--out", str(out)]
    await asyncio.to_thread(
        subprocess.run, [*build, "--interval", "1s"], check=True, capture_output=True
    )
    rules = sorted(out.glob("*.yml"))
    expected = truth()
    successes = sum(expected[model]["succeeded"] for model in MODELS)
    async with (
        run_triton_replay() as url,
        run_prometheus(
            [url.removeprefix("http://")], tmp_path, job="triton", rule_files=rules
        ) as base,
        aiohttp.ClientSession() as session,
    ):
        await wait_for_scrapes(session, base, 2)
        deadline = time.monotonic() + 30
        query = 'sum(nv_inference_request_success{job="triton"})'
        while (await scalar(session, base, query) or 0) < successes:
            assert time.monotonic() < deadline, "the replay never reached its last capture"
            await asyncio.sleep(0.2)
        await wait_for_evaluations(session, base, time.time())  # over the last capture
        yield session, base
