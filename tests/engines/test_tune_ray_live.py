"""``gpuscope tune --command`` on a real Ray Serve (``ray[serve]`` 2.60.0): run by ``make
tune-ray-check``.

``batch_wait_timeout_s`` of ``gpuscope.middleware.ray_serve.batch`` (``@serve.batch``
measured) is swept over two values, one Ray Serve per value
(``scripts/engines/ray_serve_tune_app.py``: one replica, batches of at most 8 taking
20 ms each), under 8 closed-loop embedding clients, the replica's spans sent to the
tuner's exporter. A longer window must fill bigger batches and serve more, and the short
window's loss must be named as its wait in Ray's batcher (``batch_wait``).

With ``GPUSCOPE_TUNE_CAPTURE=DIR`` the run's JSON, record and table are written to
``DIR``: the fixtures ``make test`` replays (tests/loadgen/test_tune_replay.py).
Skipped unless ``GPUSCOPE_RAY_PYTHON`` names the Ray venv's interpreter.
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
from support.ray_serve_engine import ray_python
from support.tune_ray import WAITS_S, check

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # one Ray started per value
    pytest.mark.skipif(
        ray_python() is None, reason="GPUSCOPE_RAY_PYTHON unset (make tune-ray-check)"
    ),
]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "engines" / "ray_serve_tune_app.py"
CAPTURE_VARIABLE = "GPUSCOPE_TUNE_CAPTURE"


def test_a_longer_batch_window_batches_more_and_serves_more(tmp_path: Path) -> None:
    python = ray_python()
    assert python is not None
    # Ray's sockets live under its temporary folder, whose paths must fit 107 bytes
    short = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    command = (
        f"{shlex.quote(str(python))} {shlex.quote(str(SCRIPT))} --port {{port}} "
        f"--batch-wait-timeout-s {{value}} --traces-endpoint {{otlp}} --work {short}/{{value}}"
    )
    argv = [
        sys.executable, "-m", "gpuscope", "tune", "--command", command,
        "--sweep", "batch-wait-timeout-s=" + ",".join(WAITS_S),
        "--start-timeout-s", "300", "--stop-grace-s", "60",
        "--mix", "embeddings=1", "--concurrency", "8", "--duration-s", "6", "--warmup-s", "2",
        "--objective", "max throughput with p99 <= 1000 ms",
        "--work-dir", str(tmp_path / "work"),
        "--record", str(tmp_path / "record.md"), "--json", str(tmp_path / "tune.json"),
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=800, check=False)
    finally:
        shutil.rmtree(short, ignore_errors=True)
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
    assert problems == [], "\n".join(problems)
