"""--cpu-threads caps the BLAS pool that the NumPy backend's matrix products run on."""

from __future__ import annotations

import numpy as np  # noqa: F401 - loads the BLAS library whose pool is checked
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from gpuscope import flags
from gpuscope.worker.backends import load_backend
from gpuscope.worker.config import ConfigError, WorkerConfig


def parse_config(argv: list[str], environ: dict[str, str] | None = None) -> WorkerConfig:
    return flags.parse(WorkerConfig, argv, environ, exit_on_error=False)


def blas_threads() -> set[int]:
    pools = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    if not pools:
        pytest.skip("NumPy was built without a BLAS that reports its threads")
    return {pool["num_threads"] for pool in pools}


def test_the_cpu_backend_caps_blas_threads_and_zero_leaves_them() -> None:
    with threadpool_limits(limits=2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip("the BLAS pool cannot hold two threads on this machine")
        load_backend(WorkerConfig(device="cpu", cpu_threads=0, hidden_size=32))
        assert blas_threads() == {2}
        load_backend(WorkerConfig(device="cpu", cpu_threads=1, hidden_size=32))
        assert blas_threads() == {1}


def test_cpu_threads_flag_and_its_twin() -> None:
    assert parse_config([]).cpu_threads == 1
    assert parse_config(["--cpu-threads", "0"]).cpu_threads == 0
    assert parse_config([], {"GPUSCOPE_CPU_THREADS": "4"}).cpu_threads == 4
    for wrong in ("-1", "1025"):
        with pytest.raises(ConfigError, match="--cpu-threads"):
            parse_config(["--cpu-threads", wrong])
