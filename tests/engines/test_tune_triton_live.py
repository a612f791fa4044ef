"""``gpuscope tune --command`` on a real Triton Inference Server: run by ``make
tune-triton-check``.

PyTriton (``nvidia-pytriton`` 0.7.0, bundling ``tritonserver`` 2.51.0) serves one NumPy
model that sleeps a known time per execution (``scripts/engines/triton_tune_model.py``);
its dynamic batcher's ``max_queue_delay_microseconds`` is swept through a rendered
``--config-template`` (``scripts/engines/triton_batcher.json``), one Triton per value,
under eight closed-loop clients sending KServe v2 ``infer`` requests. The server-side
view is Triton's own counters (``--server-metrics-format triton``), held to what the
model logged: the mean batch of the executions inside each step, and compute at least
the handler's time. As the delay grows, the batch must grow and Triton's queue (which
holds the batcher's wait) with it.

With ``GPUSCOPE_TUNE_CAPTURE=DIR`` the run's JSON, record and truth are written to
``DIR``: the fixtures ``make test`` replays (tests/loadgen/test_tune_replay.py).
Skipped unless ``GPUSCOPE_TRITON_PYTHON`` names the Triton venv's interpreter.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuscope.loadgen import record
from gpuscope.loadgen.results import StepResult
from support.triton_engine import triton_python
from support.tune_triton import DELAYS_US, check

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "engines" / "triton_tune_model.py"
TEMPLATE = REPO / "scripts" / "engines" / "triton_batcher.json"
CAPTURE_VARIABLE = "GPUSCOPE_TUNE_CAPTURE"
CLIENTS = 8

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),  # one engine started per value
    pytest.mark.skipif(
        triton_python() is None, reason="GPUSCOPE_TRITON_PYTHON unset (make tune-triton-check)"
    ),
]


def tune_command(python: Path) -> str:
    return (
        f"{shlex.quote(str(python))} {shlex.quote(str(SCRIPT))} --http-port {{port}} "
        "--grpc-port {grpc_port} --metrics-port {metrics_port} --config {config} "
        "--log {workdir}/executions.jsonl --workspace {workdir}/workspace"
    )


def tune_argv(python: Path, work: Path) -> list[str]:
    requests = work / "requests.jsonl"
    tensor = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}
    requests.write_text(json.dumps({"endpoint": "infer", "inputs": [tensor]}) + "\n")
    return [
        sys.executable, "-m", "gpuscope", "tune",
        "--command", tune_command(python),
        "--sweep", "max-queue-delay-us=" + ",".join(DELAYS_US),
        "--config-template", str(TEMPLATE),
        "--ready-path", "/v2/models/delay/ready",
        "--api-path", "",
        "--server-metrics", "http://127.0.0.1:{metrics_port}",
        "--server-metrics-format", "triton",
        "--requests-file", str(requests), "--model", "delay",
        "--concurrency", str(CLIENTS), "--duration-s", "4", "--warmup-s", "1",
        "--objective", "max throughput with p99 <= 100 ms",
        "--work-dir", str(work / "work"),
        "--record", str(work / "record.md"), "--json", str(work / "tune.json"),
    ]  # fmt: skip


def window_truth(executions: Path, step: StepResult) -> dict[str, Any]:
    """What the model logged inside the step's window."""
    start = (step.finished - timedelta(seconds=step.duration_s)).timestamp()
    end = step.finished.timestamp()
    lines = [json.loads(line) for line in executions.read_text().splitlines() if line.strip()]
    inside = [e for e in lines if start <= e["at"] <= end]
    requests = sum(e["requests"] for e in inside)
    return {
        "executions": len(inside),
        "mean_batch": requests / len(inside),
        "handler_ms": 1000 * sum(e["handler_s"] for e in inside) / len(inside),
    }


def test_a_triton_queue_delay_sweep_batches_more_and_queues_longer(tmp_path: Path) -> None:
    python = triton_python()
    assert python is not None
    done = subprocess.run(
        tune_argv(python, tmp_path), capture_output=True, text=True, timeout=400, check=False
    )
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    _, steps = record.read_json((tmp_path / "tune.json").read_text())
    truth = {
        step.config: window_truth(
            tmp_path / "work" / f"{index + 1:02d}-{step.config.split('=')[1]}" / "executions.jsonl",
            step,
        )
        for index, step in enumerate(steps)
    }
    print(json.dumps(truth, indent=2))
    problems = check(steps, truth)
    capture = os.environ.get(CAPTURE_VARIABLE)
    if capture and not problems:
        folder = Path(capture)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "tune.json", folder / "tune.json")
        shutil.copy(tmp_path / "record.md", folder / "record.md")
        (folder / "truth.json").write_text(json.dumps(truth, indent=2, sort_keys=True) + "\n")
        (folder / "table.txt").write_text(done.stdout)
    assert problems == [], "\n".join(problems)
    assert "best under 'max throughput with p99 <= 100 ms'" in done.stdout
