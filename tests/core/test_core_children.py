"""gpuscope.children: the exporter's and the worker's command lines built from their
settings, and children that fail to start named as such."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gpuscope import flags
from gpuscope.children import (
    TRACES_PATH,
    ChildFailed,
    Children,
    exporter_args,
    simulated_gpu_uuid,
    worker_args,
)
from gpuscope.contract import http as http_paths
from gpuscope.exporter.config import ExporterConfig
from gpuscope.exporter.gpu.simulated import simulated_uuid
from gpuscope.exporter.gpu.source import GpuSourceKind
from gpuscope.flags import ConfigError
from gpuscope.worker.config import BatchingMode, WorkerConfig

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


def test_the_command_lines_parse_back_to_the_settings_they_were_built_from() -> None:
    args = exporter_args(1234, gpu_source="simulated", gpu_interval_s=0.5, log_level="warning")
    assert args[0] == "exporter"
    assert flags.parse(ExporterConfig, args[1:], {}, exit_on_error=False) == ExporterConfig(
        listen="127.0.0.1:1234",
        gpu_source=GpuSourceKind.SIMULATED,
        gpu_interval_s=0.5,
        log_level="warning",
    )
    args = worker_args(8001, batching="continuous", no_tracing=True, serve=("embeddings",))
    assert args[0] == "worker"
    assert flags.parse(WorkerConfig, args[1:], {}, exit_on_error=False) == WorkerConfig(
        host="127.0.0.1",
        port=8001,
        batching=BatchingMode.CONTINUOUS,
        no_tracing=True,
        serve=("embeddings",),
    )


def test_a_value_the_child_would_refuse_fails_in_the_parent() -> None:
    with pytest.raises(ConfigError, match=r"^--gpu-interval-s: must be greater than 0"):
        exporter_args(1234, gpu_interval_s=0)
    with pytest.raises(ConfigError, match=r"^--otlp-endpoint: expected an http\(s\) URL"):
        worker_args(8001, otlp_endpoint="tempo:4318")
    with pytest.raises(TypeError):  # a field that does not exist
        worker_args(8001, warp_speed=9)


def test_the_paths_and_uuids_are_the_exporters_own() -> None:
    assert TRACES_PATH == http_paths.TRACES_PATH
    assert simulated_gpu_uuid(1) == simulated_uuid(1)


def test_a_child_that_exits_while_starting_is_named() -> None:
    with socket.socket() as taken, Children() as children:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        exporter = children.exporter("busy exporter", port=taken.getsockname()[1])
        with pytest.raises(
            ChildFailed, match=r"^busy exporter exited with status 1 while starting"
        ):
            exporter.wait_ready_blocking()
        worker = children.worker("busy worker", port=taken.getsockname()[1], no_tracing=True)
        with pytest.raises(ChildFailed, match=r"^busy worker exited with status 1 while starting"):
            asyncio.run(worker.wait_ready())
