"""Choosing a GPU source by flag, and the retired DCGM source refused with a pointer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from gpuscope.exporter.gpu import factory
from gpuscope.exporter.gpu.factory import GpuSourceUnavailable, open_gpu_source
from gpuscope.exporter.gpu.simulated import SimulatedSource
from gpuscope.exporter.gpu.source import GpuSourceKind

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


def test_factory_kinds() -> None:
    assert open_gpu_source(GpuSourceKind.NONE, scenario=None, simulated_count=1) is None
    source = open_gpu_source(GpuSourceKind.SIMULATED, scenario=None, simulated_count=3)
    assert isinstance(source, SimulatedSource) and len(source.devices()) == 3
    # no NVML driver on this machine: auto settles for request metrics only
    assert open_gpu_source(GpuSourceKind.AUTO, scenario=None, simulated_count=1) is None


def test_auto_tries_nvml_alone() -> None:
    assert [entry.kind for entry in factory.HARDWARE_SOURCES] == [GpuSourceKind.NVML]


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        (cast(GpuSourceKind, "cuda"), ValueError, "--gpu-source must be one of"),
        (GpuSourceKind.NVML, GpuSourceUnavailable, "--gpu-source nvml: nvmlInit failed"),
        (GpuSourceKind.DCGM, ValueError, "--gpu-source dcgm was retired: .*dcgm-exporter"),
    ],
)
def test_factory_errors_name_the_flag(
    kind: GpuSourceKind, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        open_gpu_source(kind, scenario=None, simulated_count=1)


@pytest.mark.parametrize("command", ["exporter", "doctor"])
def test_the_commands_refuse_dcgm_and_point_to_the_docs(command: str) -> None:
    """Flag or environment: exit 2 before anything opens, one line naming the way on."""
    args = ["--listen", "127.0.0.1:0"] if command == "exporter" else []
    result = subprocess.run(
        [str(Path(sys.executable).parent / "gpuscope"), command, *args],
        env={**os.environ, "GPUSCOPE_GPU_SOURCE": "dcgm"},
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "--gpu-source dcgm was retired" in result.stderr
    assert "dcgm-exporter" in result.stderr and "docs/gpu.md" in result.stderr


def test_factory_scenario_errors_name_the_flag(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("events: [{at: 0, gpu: 5, fault: fall_off_bus}]\n")
    with pytest.raises(ValueError, match=r"--gpu-scenario .*names GPU 5"):
        open_gpu_source(GpuSourceKind.SIMULATED, scenario=scenario, simulated_count=2)
    with pytest.raises(ValueError, match="--gpu-scenario applies to --gpu-source simulated"):
        open_gpu_source(GpuSourceKind.NVML, scenario=scenario, simulated_count=2)
