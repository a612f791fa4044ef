"""A Ray Serve deployment whose ``batch_wait_timeout_s`` is a flag, for ``make
tune-ray-check``: ``gpuscope tune --command`` starts one per value.

Runs in the Ray venv (``.venv-ray``: ``ray[serve]`` with gpuscope installed). It starts
a local Ray limited to the shared 2-core machine (its temporary folder under WORK),
serves one replica of ``Embedder`` on 127.0.0.1:PORT with OpenAI-shaped
``/v1/embeddings`` and ``/v1/models`` (and ``/health``, ready once the replica is), and
serves until SIGTERM or SIGINT, then shuts Serve and Ray down. The setup is
docs/engines/ray-serve.md's: a FastAPI ingress under ``GpuscopeMiddleware``,
``setup_tracing()`` in the replica, ``gpuscope.middleware.ray_serve.batch`` in place of
``@serve.batch``; the "model" awaits ``COMPUTE_S`` per batch, whatever its size.

    python scripts/engines/ray_serve_tune_app.py --port 8000 --batch-wait-timeout-s 0.01 \\
        --traces-endpoint http://127.0.0.1:9420/v1/traces --work /tmp/ray-work
"""

# No `from __future__ import annotations`: FastAPI in the replica must resolve the body's
# annotation (see ray_serve_app.py).
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

from gpuscope.middleware import GpuscopeMiddleware, ray_serve, setup_tracing

SERVICE = "ray-tuned-embedder"
MODEL = "toy-embedder"
MAX_BATCH_SIZE = 8
COMPUTE_S = 0.02  # per batch, whatever its size


class EmbeddingsRequest(BaseModel):
    input: str
    model: str = MODEL


def deployment(batch_wait_timeout_s: float, traces_endpoint: str) -> Any:
    """The deployment, built after the flags are read: the batch decorator takes its
    window when the class is defined, and Ray ships this class to the replica by value."""
    app = FastAPI(telemetry={"tracing": False})
    app.add_middleware(GpuscopeMiddleware, excluded_paths=["/health"])

    @serve.deployment(
        max_ongoing_requests=32,  # above max_batch_size, or Ray caps batches below it
        ray_actor_options={"num_cpus": 0.5},
        health_check_period_s=2,
    )
    @serve.ingress(app)
    class Embedder:
        def __init__(self) -> None:
            self.provider = setup_tracing(traces_endpoint, SERVICE, schedule_delay_ms=200)

        def __del__(self) -> None:
            self.provider.shutdown(5.0)

        @app.get("/health")
        async def health(self) -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models(self) -> dict[str, Any]:
            return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

        @app.post("/v1/embeddings")
        async def embeddings(self, body: EmbeddingsRequest) -> dict[str, Any]:
            vector = await self.embed_batch(body.input)
            tokens = len(body.input.split())
            return {
                "object": "list",
                "model": MODEL,
                "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }

        @ray_serve.batch(
            max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=batch_wait_timeout_s, model=MODEL
        )
        async def embed_batch(self, texts: list[str]) -> list[list[float]]:
            await asyncio.sleep(COMPUTE_S)
            return [[float(len(text)), float(sum(map(ord, text)) % 997)] for text in texts]

    return Embedder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--batch-wait-timeout-s", type=float, required=True)
    parser.add_argument("--traces-endpoint", required=True)
    parser.add_argument("--work", type=Path, required=True)
    options = parser.parse_args()
    options.work.mkdir(parents=True, exist_ok=True)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=str(options.work.absolute()),
        log_to_driver=False,
        configure_logging=False,
    )
    # After ray.init, which installs a SIGTERM handler of its own that exits without
    # stopping every process it started: stop Serve, then Ray, from the main thread.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": options.port})
        embedder = deployment(options.batch_wait_timeout_s, options.traces_endpoint)
        serve.run(embedder.bind(), name="embedder", route_prefix="/")
        print(f"READY http://127.0.0.1:{options.port}", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.exit(main())
