"""PyTriton serving one NumPy model of known handler time, its dynamic batcher read from a
file: the engine ``make tune-triton-check`` sweeps with ``gpuscope tune --command``.

Run by the Triton venv's interpreter (``nvidia-pytriton``, which bundles ``tritonserver``),
not by the tuner's: it imports nothing of gpuscope. The model ``delay`` sleeps
``HANDLER_S`` per execution whatever the batch holds, and writes one JSON line per
execution to ``--log`` (when, the requests it held, the handler's own seconds): the truth
the check holds Triton's counters to. ``--config`` is a JSON object with
``max_queue_delay_microseconds`` and ``max_batch_size`` (``gpuscope tune
--config-template scripts/engines/triton_batcher.json`` renders one per value).

    python scripts/engines/triton_tune_model.py --http-port P --grpc-port P \
        --metrics-port P --config FILE --log FILE --workspace DIR
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

HANDLER_S = 0.010
MODEL = "delay"


def handler(log_path: Path) -> Any:
    lock = threading.Lock()
    log = log_path.open("a", buffering=1, encoding="utf-8")

    def infer(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        started = time.perf_counter()
        time.sleep(HANDLER_S)
        record = {
            "at": time.time(),  # wall clock: the tuner's steps say when they finished
            "requests": len(requests),
            "handler_s": time.perf_counter() - started,
        }
        with lock:
            log.write(json.dumps(record) + "\n")
        return [{"y": request["x"] * 2} for request in requests]

    return infer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--http-port", "--grpc-port", "--metrics-port"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--workspace", type=Path, required=True)
    args = parser.parse_args()
    batcher = json.loads(args.config.read_text())
    # Triton's Python backend stub links libpython by its soname: this interpreter's
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
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Triton(config=config, workspace=args.workspace) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=handler(args.log),
            inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
            outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
            config=ModelConfig(
                max_batch_size=int(batcher["max_batch_size"]),
                batcher=DynamicBatcher(
                    max_queue_delay_microseconds=int(batcher["max_queue_delay_microseconds"])
                ),
            ),
            strict=False,
        )
        triton.run()
        print(f"ready: {json.dumps(batcher)}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
