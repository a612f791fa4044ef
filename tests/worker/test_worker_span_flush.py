"""The worker as a real process: its span flush keeps to --shutdown-timeout-s; bad URLs stop it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from support.closing_endpoint import ClosingEndpoint, closing_endpoint
from support.waiting import wait_until

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

GPUSCOPE = [sys.executable, "-m", "gpuscope.cli"]
SHUTDOWN_TIMEOUT_S = 1.0


def wait_for_port(worker: subprocess.Popen[str]) -> int:
    """Read the worker's log until uvicorn says where it listens."""
    assert worker.stderr is not None
    deadline = time.monotonic() + 60
    for line in worker.stderr:
        found = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
        if found:
            # Keep reading, so that a full pipe never blocks the worker's logging.
            threading.Thread(target=worker.stderr.read, daemon=True).start()
            return int(found.group(1))
        assert time.monotonic() < deadline, "the worker did not start"
    raise AssertionError(f"the worker exited with {worker.wait()} before listening")


@pytest.mark.slow
def test_sigterm_exit_keeps_to_the_shutdown_timeout_with_the_exporter_unreachable() -> None:
    with closing_endpoint() as endpoint:
        code, elapsed = _sigterm_while_retrying(endpoint)
    assert code == 0
    # The exporter's own retries would take 10 s, the SDK's default flush 30 s.
    assert elapsed < SHUTDOWN_TIMEOUT_S + 6, f"exit took {elapsed:.1f} s"


def _sigterm_while_retrying(endpoint: ClosingEndpoint) -> tuple[int, float]:
    worker = subprocess.Popen(
        [
            *GPUSCOPE, "worker", "--port", "0", "--device", "cpu", "--batching", "none",
            "--otlp-endpoint", endpoint.url,
            "--shutdown-timeout-s", str(SHUTDOWN_TIMEOUT_S),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        port = wait_for_port(worker)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(3):  # spans that the flush will try and fail to deliver
                body = {"model": "gpuscope-synthetic", "input": "hello"}
                assert client.post("/v1/embeddings", json=body).status_code == 200
        wait_until(lambda: endpoint.attempts >= 2, "the worker's span export tried again", 30)
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        assert worker.stderr is not None
        worker.stderr.close()
    return code, elapsed


@pytest.mark.parametrize("endpoint", ["notaurl", "ftp://collector/v1/traces", "http://"])
def test_an_otlp_endpoint_that_is_not_a_url_stops_the_worker_at_start(endpoint: str) -> None:
    result = subprocess.run(
        [*GPUSCOPE, "worker", "--otlp-endpoint", endpoint],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--otlp-endpoint" in result.stderr
    assert repr(endpoint) in result.stderr
