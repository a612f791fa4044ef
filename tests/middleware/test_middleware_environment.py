"""``GpuscopeMiddleware(app)`` with no arguments, as vLLM's ``--middleware`` builds it.

Each case runs in a fresh Python process (the global tracer provider can be set once
per process) against a real exporter: no provider installed means the middleware
sets up its own from the ``OTEL_*`` variables and flushes it at exit; the
``GPUSCOPE_*`` variables give the options an argument would.
"""

from __future__ import annotations

import asyncio
import os
import sys

import aiohttp
import pytest

from gpuscope.exporter.service import RunningExporter
from support.exporter_fixtures import samples, scrape

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

APP = """
import asyncio, httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from gpuscope.middleware import GpuscopeMiddleware

async def completions(request):
    return JSONResponse({"id": "x", "object": "text_completion", "model": "tiny"})

async def health(request):
    return JSONResponse({})

app = GpuscopeMiddleware(Starlette(routes=[
    Route("/v1/completions", completions, methods=["POST"]), Route("/health", health)]))

async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        for _ in range(3):
            assert (await client.post("/v1/completions", json={})).status_code == 200
        assert (await client.get("/health")).status_code == 200

asyncio.run(main())
print("served")
"""


async def run_app(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GPUSCOPE_"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        APP,
        env=clean | env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    text = output.decode()
    assert process.returncode == 0, text
    assert "served" in text
    return text


def request_count(text: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples(text)
        if s.name == "gpuscope_request_duration_seconds_count"
        and labels.items() <= s.labels.items()
    )


async def test_without_a_provider_the_middleware_exports_to_the_configured_endpoint(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    await run_app(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": running_exporter.url + "/v1/traces",
            "OTEL_SERVICE_NAME": "zero-config",
            "GPUSCOPE_EXCLUDED_PATHS": "/metrics, /health",
        }
    )
    text = await scrape(exporter_http, running_exporter)
    assert request_count(text, service="zero-config", route="/v1/completions", model="tiny") == 3
    assert request_count(text, route="/health") == 0  # excluded by the variable
    assert request_count(text) == 3


async def test_gpuscope_service_name_and_gpu_uuid_come_from_the_environment(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    await run_app(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": running_exporter.url,  # + /v1/traces, per the spec
            "GPUSCOPE_SERVICE_NAME": "from-gpuscope-variable",
            "GPUSCOPE_GPU_UUID": "GPU-1234",
        }
    )
    text = await scrape(exporter_http, running_exporter)
    assert request_count(text, service="from-gpuscope-variable", uuid="GPU-1234") == 3 + 1


async def test_otel_sdk_disabled_serves_without_exporting(
    running_exporter: RunningExporter, exporter_http: aiohttp.ClientSession
) -> None:
    await run_app(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": running_exporter.url + "/v1/traces",
            "OTEL_SDK_DISABLED": "true",
        }
    )
    assert request_count(await scrape(exporter_http, running_exporter)) == 0
