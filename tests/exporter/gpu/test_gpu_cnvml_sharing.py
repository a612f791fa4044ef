"""GPU sharing on the C fake NVML, from the H200 capture under load: three processes on one
GPU (two memhogs and gpu_burn, as ``--query-compute-apps`` and ``pmon`` saw them), each
with its memory and SM use; the compute mode; MPS; and the ``contended`` series that
says several processes time-slice the GPU, which MPS or an exclusive mode rules out."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gpu_cnvml_defects import value, wait_for
from test_gpu_cnvml_exporter import exporter

from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

UUID = "GPU-00000000-0000-0000-0000-000000000000"
MIB = 2**20
GPU = f'gpu="0",uuid="{UUID}"'
# the capture's processes: pid -> (MiB used, pmon's SM %; "-" there: no kernel sampled)
CAPTURED = {10291: (2566, 0), 10293: (1542, 0), 10309: (28234, 99)}
RELEASES = [library.PYNVML_FLOOR, library.PYNVML_NEWEST]


def _environment(tmp_path: Path, release: str, **knobs: str) -> dict[str, str]:
    """The H200 under load, with pynvml ``release`` and a driver of its time (the floor
    reads the 32-byte process records of R535, the newest the 24-byte ones)."""
    capture = profiles.capture("nvidia-h200__590")
    profile = profiles.profile_from_capture(capture, state="load").write(tmp_path / "load")
    if release == library.PYNVML_FLOOR:
        knobs.setdefault("PROCESS_STRIDE", "32")
        return library.environment(profile, branch=535, pynvml=release, knobs=knobs)
    return library.environment(profile, pynvml=release, knobs=knobs)


def mode(name: str) -> str:
    return f'gpuscope_gpu_compute_mode{{gpu="0",mode="{name}",uuid="{UUID}"}}'


def _listed(text: str) -> bool:
    return value(text, f"gpuscope_gpu_compute_processes{{{GPU}}}") == 3


@pytest.mark.parametrize("release", RELEASES)
def test_three_processes_without_mps_contend_and_each_shows_its_share(
    tmp_path: Path, release: str
) -> None:
    with exporter(_environment(tmp_path, release)) as url:
        text = wait_for(url, _listed)
    assert value(text, f"gpuscope_gpu_contended{{{GPU}}}") == 1
    assert value(text, f"gpuscope_gpu_mps_processes{{{GPU}}}") == 0
    assert value(text, mode("default")) == 1
    for pid, (mib, sm) in CAPTURED.items():
        labels = f'gpu="0",pid="{pid}",uuid="{UUID}"'
        assert value(text, f"gpuscope_gpu_process_memory_used_bytes{{{labels}}}") == mib * MIB
        assert value(text, f"gpuscope_gpu_process_sm_utilization_ratio{{{labels}}}") == sm / 100


@pytest.mark.parametrize(
    "knobs",
    [
        # MPS: the three are the server's clients (nvmlDeviceGetMPSComputeRunningProcesses)
        {"SET": "gpu.0.processes.mps=10291:2690646016 10293:1616904192 10309:29605494784"},
        # EXCLUSIVE_PROCESS (3): one process, or one MPS server, may hold a context
        {"SET": "gpu.0.compute_mode=3"},
    ],
    ids=["mps", "exclusive_process"],
)
def test_mps_or_an_exclusive_mode_is_no_contention(tmp_path: Path, knobs: dict[str, str]) -> None:
    with exporter(_environment(tmp_path, library.PYNVML_NEWEST, **knobs)) as url:
        text = wait_for(url, _listed)
    assert value(text, f"gpuscope_gpu_contended{{{GPU}}}") == 0
    if "mps" in knobs["SET"]:
        assert value(text, f"gpuscope_gpu_mps_processes{{{GPU}}}") == 3
    else:
        assert value(text, mode("exclusive_process")) == 1


def test_the_per_process_series_stay_under_the_series_cap(tmp_path: Path) -> None:
    env = _environment(tmp_path, library.PYNVML_NEWEST)
    with exporter(env, "--max-series", "2") as url:
        text = wait_for(url, _listed)
    pids = {
        line.split('pid="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("gpuscope_gpu_process_memory_used_bytes{")
    }
    assert pids == {"10309", "__overflow__"}  # the largest kept, the other two summed
    overflow = f'gpu="0",pid="__overflow__",uuid="{UUID}"'
    assert value(text, f"gpuscope_gpu_process_memory_used_bytes{{{overflow}}}") == (
        (2566 + 1542) * MIB
    )
