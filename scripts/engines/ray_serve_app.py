"""A Ray Serve deployment measured by gpuscope, for ``make ray-check``.

Runs in the Ray venv (``.venv-ray``: ``ray[serve]`` with gpuscope installed), not in
gpuscope's. It starts a local Ray limited to the shared 2-core machine (two CPUs, no
dashboard, its temporary folder under WORK), serves ``Embedder`` on 127.0.0.1:PORT
with N replicas, prints one line ``READY http://127.0.0.1:PORT`` and serves until
SIGTERM or SIGINT, then shuts Serve and Ray down.

``Embedder`` is the documented setup (docs/engines/ray-serve.md): a FastAPI ingress
under ``GpuscopeMiddleware``, ``setup_tracing()`` in the replica's ``__init__``, and
``gpuscope.middleware.ray_serve.batch`` in place of ``@serve.batch``. Its "model"
awaits a fixed time per batch, standing in for a device. ``/probe`` goes through a
plain ``@serve.batch`` and reports which request's timeline the handler sees.

    python scripts/engines/ray_serve_app.py --port 8000 --traces-endpoint \\
        http://127.0.0.1:9420/v1/traces --work /tmp/ray-work
"""

# No `from __future__ import annotations`: Ray rebuilds the deployment class in each
# replica, where FastAPI could not resolve a string annotation such as "EmbedRequest"
# and would take the body for a query parameter.
import argparse
import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import ray
from fastapi import FastAPI
from pydantic import BaseModel
from ray import serve

from gpuscope.middleware import GpuscopeMiddleware, current_timeline, ray_serve, setup_tracing

SERVICE = "ray-embedder"
MODEL = "toy-embedder"
MAX_BATCH_SIZE = 4
BATCH_WAIT_TIMEOUT_S = 0.05
COMPUTE_S = 0.02  # per batch, whatever its size: a device runs a batch in one pass

app = FastAPI(telemetry={"tracing": False})  # gpuscope's span is the request's only one
app.add_middleware(GpuscopeMiddleware, excluded_paths=["/healthz"])


class EmbedRequest(BaseModel):
    text: str


@serve.deployment(
    max_ongoing_requests=32,  # above max_batch_size, or Ray caps batches below it
    ray_actor_options={"num_cpus": 0.5},
    health_check_period_s=2,
)
@serve.ingress(app)
class Embedder:
    def __init__(self, traces_endpoint: str) -> None:
        # In the replica's process: each replica exports its own spans, under its own
        # service.instance.id, straight to the exporter.
        self.provider = setup_tracing(traces_endpoint, SERVICE, schedule_delay_ms=200)
        self.instance = str(self.provider.resource.attributes["service.instance.id"])

    def __del__(self) -> None:
        # Ray Serve calls it when it stops the replica: send what is still queued.
        self.provider.shutdown(5.0)

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"instance": self.instance}

    @app.post("/embed")
    async def embed(self, body: EmbedRequest) -> dict[str, Any]:
        vector = await self.embed_batch(body.text)
        return {"embedding": vector, "instance": self.instance}

    @ray_serve.batch(
        max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_TIMEOUT_S, model=MODEL
    )
    async def embed_batch(self, texts: list[str]) -> list[list[float]]:
        await asyncio.sleep(COMPUTE_S)
        return [[float(len(text)), float(sum(map(ord, text)) % 997)] for text in texts]

    @app.post("/probe")
    async def probe(self) -> dict[str, Any]:
        """Whether a plain @serve.batch handler sees this request's timeline."""
        mine = current_timeline()
        seen = await self.probe_batch(id(mine))
        return {"handler_saw_own_timeline": seen == id(mine), "instance": self.instance}

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=0.01)  # type: ignore[untyped-decorator]
    async def probe_batch(self, timelines: list[int]) -> list[int]:
        inside = id(current_timeline())
        return [inside] * len(timelines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--traces-endpoint", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--metrics-port", type=int, help="serve Ray's own metrics here")
    options = parser.parse_args()
    options.work.mkdir(parents=True, exist_ok=True)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=str(options.work.absolute()),
        log_to_driver=False,
        configure_logging=False,
        _metrics_export_port=options.metrics_port,
    )
    # After ray.init, which installs a SIGTERM handler of its own that exits without
    # stopping every process it started (its dashboard and runtime-env agents were left
    # running): stop Serve, then Ray, from the main thread.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": options.port})
        deployment: Any = Embedder  # what @serve.deployment made of the class
        serve.run(
            deployment.options(num_replicas=options.replicas).bind(options.traces_endpoint),
            name="embedder",
            route_prefix="/",
        )
        print(f"READY http://127.0.0.1:{options.port}", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.exit(main())
