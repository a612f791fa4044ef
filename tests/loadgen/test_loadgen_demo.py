"""The demo end to end: real exporter and worker processes, real load, real metrics."""

from __future__ import annotations

import socket

import pytest

from gpuscope import flags
from gpuscope.children import free_port
from gpuscope.loadgen.demo import DemoFailed, DemoOptions, main, run_demo, with_ports
from gpuscope.spans import PHASES
from gpuscope.worker.config import BatchingMode

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


def test_the_demo_shows_where_the_time_went(capsys: pytest.CaptureFixture[str]) -> None:
    options = DemoOptions(
        duration_s=2.0,
        concurrency=4,
        batching=BatchingMode.DYNAMIC,
        exporter_port=free_port(),
        worker_port=free_port(),
        exit=True,
    )
    result = run_demo(options)
    assert result.ok > 0 and not result.errors
    assert set(result.by_kind) == {"embeddings", "completions-stream"}
    assert result.ttft_ms["p50"] > 0
    # every phase of the worker's requests reached the exporter's histograms
    assert result.server is not None
    assert result.server.requests >= result.ok
    assert set(result.server.phase_mean_ms) == set(PHASES)
    assert result.server.batch_size_mean is not None and result.server.batch_size_mean >= 1
    assert result.server.sm_occupancy is not None
    out = capsys.readouterr().out
    assert "exporter: http://127.0.0.1:" in out
    assert "where the time went" in out and "compute ms" in out


def test_the_demo_refuses_ports_that_are_taken(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        options = DemoOptions(exporter_port=free_port(), worker_port=port, exit=True)
        with pytest.raises(DemoFailed, match=f"127.0.0.1:{port} is already in use") as refused:
            run_demo(options)
        # the hint names the flag, and the twin that reaches the demo through `make demo`
        assert "pass --worker-port 0" in str(refused.value)
        assert "GPUSCOPE_DEMO_WORKER_PORT=0 make demo" in str(refused.value)
        assert main(["--exporter-port", str(port), "--exit"]) == 1
    assert "already in use" in capsys.readouterr().err


def test_the_port_hints_environment_twin_sets_the_port() -> None:
    # what the refusal tells a `make demo` user to set must really choose any free port
    assert flags.parse(DemoOptions, [], {"GPUSCOPE_DEMO_WORKER_PORT": "0"}).worker_port == 0


def test_demo_arguments_are_checked() -> None:
    with pytest.raises(SystemExit):
        flags.parse(DemoOptions, ["--duration-s", "0"], {})
    with pytest.raises(SystemExit):
        flags.parse(DemoOptions, [], {"GPUSCOPE_DEMO_BATCHING": "sometimes"})
    options = with_ports(
        flags.parse(DemoOptions, ["--exporter-port", "0", "--worker-port", "0", "--exit"], {})
    )
    assert options.exporter_port > 0
    assert not options.keep_running
