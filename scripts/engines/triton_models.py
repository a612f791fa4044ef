"""PyTriton serving three NumPy models with a known handler time, for ``make triton-check``.

Run by the Triton venv's interpreter (``nvidia-pytriton``, which bundles ``tritonserver``),
not by the test's: it imports nothing of gpuscope. Each model writes one JSON line per
execution to ``<log dir>/<model>.jsonl``: the requests and inferences it held, the
handler's own seconds, and whether it failed. That is the truth the test checks every
recorded Triton series against.

- ``steady``: dynamic batching, a fixed sleep per execution;
- ``failing``: the same, and an execution holding a request whose first value is
  negative raises, so every request of that batch fails;
- ``cached``: the response cache on; a repeated input is answered by Triton's cache
  without an execution.

    python scripts/engines/triton_models.py --http-port P --grpc-port P --metrics-port P \
        --log-dir DIR --workspace DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from pytriton.model_config import (  # type: ignore[import-not-found]
    DynamicBatcher,
    ModelConfig,
    Tensor,
)
from pytriton.triton import Triton, TritonConfig  # type: ignore[import-not-found]

# The handler's sleep per execution and the batcher's settings, per model.
HANDLER_S = {"steady": 0.004, "failing": 0.003, "cached": 0.008}
MAX_BATCH = 8
QUEUE_DELAY_US = 2000
CACHE_BYTES = 16 * 1024 * 1024


def handler(name: str, log_dir: Path) -> Any:
    lock = threading.Lock()
    log = (log_dir / f"{name}.jsonl").open("a", buffering=1, encoding="utf-8")

    def infer(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        started = time.perf_counter()
        time.sleep(HANDLER_S[name])
        inferences = sum(int(request["x"].shape[0]) for request in requests)
        failed = name == "failing" and any(float(r["x"].flat[0]) < 0 for r in requests)
        record = {
            "requests": len(requests),
            "inferences": inferences,
            "handler_s": time.perf_counter() - started,
            "failed": failed,
        }
        with lock:
            log.write(json.dumps(record) + "\n")
        if failed:
            raise ValueError("a request of this batch asked to fail")
        return [{"y": request["x"] * 2} for request in requests]

    return infer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--http-port", "--grpc-port", "--metrics-port"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--workspace", type=Path, required=True)
    args = parser.parse_args()
    # Triton's Python backend stub links libpython by its soname: the one of this
    # interpreter, not an older one of the system's (another patch release's stdlib
    # fails in the stub: "RLock object has no attribute '_recursion_count'")
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_address="127.0.0.1",
        metrics_port=args.metrics_port,
        allow_metrics=True,
        allow_gpu_metrics=False,
        cache_config=[f"local,size={CACHE_BYTES}"],
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Triton(config=config, workspace=args.workspace) as triton:
        for name in HANDLER_S:
            triton.bind(
                model_name=name,
                infer_func=handler(name, args.log_dir),
                inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
                outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
                config=ModelConfig(
                    max_batch_size=MAX_BATCH,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=QUEUE_DELAY_US),
                    response_cache=name == "cached",
                ),
                strict=False,
            )
        triton.run()
        print("ready", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
