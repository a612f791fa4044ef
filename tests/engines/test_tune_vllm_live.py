"""``gpuscope tune --command`` on a real vLLM (CPU build, the tiny local model): run by
``make tune-vllm-check``.

``--max-num-seqs`` is swept over 2 and 8 under 16 streaming clients, one vLLM per value,
its spans sent to the exporter the tuner starts (``--otlp-traces-endpoint {otlp}``): with
more sequences running at once, fewer requests wait for the scheduler, so the queue's
share of the mean must fall and compute's rise. vLLM's own ``/metrics`` is read around
each row's measured requests (``--engine-metrics``), and each row's queue and compute
means must be within 5 % of vLLM's histograms over those requests. The environment
vLLM needs on a CPU machine is given with ``env`` in the command itself.

With ``GPUSCOPE_TUNE_CAPTURE=DIR`` the run's JSON, record, table and vLLM's scrapes
bounding each row (``metrics/``) are written to ``DIR``: the fixtures ``make test``
replays (tests/loadgen/test_tune_replay.py).
Skipped unless ``GPUSCOPE_VLLM_PYTHON`` names the vLLM venv's interpreter.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuscope.loadgen import record
from support.tune_vllm import check
from support.vllm_engine import SERVED_MODEL, tiny_model, vllm_python

pytestmark = [
    pytest.mark.slow,
    pytest.mark.processes,
    pytest.mark.timeout(1800),  # one engine started per value
    pytest.mark.skipif(
        vllm_python() is None, reason="GPUSCOPE_VLLM_PYTHON unset (make tune-vllm-check)"
    ),
]
CAPTURE_VARIABLE = "GPUSCOPE_TUNE_CAPTURE"
MODEL_VARIABLE = "GPUSCOPE_VLLM_MODEL_DIR"


def vllm_command(python: Path, model: Path, sockets: Path) -> str:
    # what vLLM needs on a 2-core CPU machine (docs/engines/vllm.md); its IPC sockets in a
    # short folder: a socket's path must fit 107 bytes, and pytest's folders do not
    env = (
        "env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0-1 HF_HUB_OFFLINE=1 "
        f"TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_RPC_BASE_PATH={sockets} "
        f"TMPDIR={sockets}"
    )
    return (
        f"{env} {shlex.quote(str(python))} -m vllm.entrypoints.openai.api_server "
        f"--model {shlex.quote(str(model))} --served-model-name {SERVED_MODEL} "
        "--dtype bfloat16 --max-model-len 512 --max-num-seqs {value} "
        "--host 127.0.0.1 --port {port} --otlp-traces-endpoint {otlp}"
    )


def test_more_sequences_queue_less_and_compute_more(tmp_path: Path) -> None:
    python = vllm_python()
    assert python is not None
    folder = os.environ.get(MODEL_VARIABLE)
    model = tiny_model(python, Path(folder) if folder else tmp_path / "tiny-llama").absolute()
    sockets = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp"))
    argv = [
        sys.executable, "-m", "gpuscope", "tune",
        "--command", vllm_command(python, model, sockets),
        "--sweep", "max-num-seqs=2,8",
        "--start-timeout-s", "600", "--stop-grace-s", "60",
        "--mix", "completions-stream=1", "--output-tokens", "16",
        "--concurrency", "16", "--duration-s", "8", "--warmup-s", "2", "--timeout-s", "60",
        "--objective", "max throughput with p99 <= 5000 ms",
        "--engine-metrics", "http://127.0.0.1:{port}",
        "--work-dir", str(tmp_path / "work"),
        "--record", str(tmp_path / "record.md"), "--json", str(tmp_path / "tune.json"),
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1500, check=False)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    print(done.stdout)
    assert done.returncode == 0, done.stderr[-4000:]
    _, steps = record.read_json((tmp_path / "tune.json").read_text())
    problems = check(steps, done.stdout)
    capture = os.environ.get(CAPTURE_VARIABLE)
    if capture and not problems:
        target = Path(capture)
        target.mkdir(parents=True, exist_ok=True)
        for name in ("tune.json", "record.md"):
            shutil.copy(tmp_path / name, target / name)
        (target / "table.txt").write_text(done.stdout)
        # vLLM's own /metrics before and after each row's measured requests
        metrics = target / "metrics"
        metrics.mkdir(exist_ok=True)
        for folder, value in (("01-2", "2"), ("02-8", "8")):
            for when in ("before", "after"):
                kept = tmp_path / "work" / folder / "engine-metrics" / f"step-1-{when}.prom"
                shutil.copy(kept, metrics / f"max-num-seqs-{value}-{when}.prom")
    assert problems == [], "\n".join(problems)
