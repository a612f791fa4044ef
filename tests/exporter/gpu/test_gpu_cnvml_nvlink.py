"""NVLink traffic on the C fake NVML: the H200 and H100 captures' 18 links (``nvidia-smi
nvlink -s``) give the link count and the data byte counters (fields 91, 138/139 over all
links), which grow with the traffic; the L40S has no NVLink and an H200 in MIG mode
answers NotSupported, so theirs are absent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_gpu_cnvml_defects import value, wait_for
from test_gpu_cnvml_exporter import exporter

from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

GPU = 'gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"'
TX = f"gpuscope_gpu_nvlink_transmit_bytes_total{{{GPU}}}"
RX = f"gpuscope_gpu_nvlink_receive_bytes_total{{{GPU}}}"
LINKS = f"gpuscope_gpu_nvlink_links{{{GPU}}}"
RATE = 25e9  # bytes/s each way: a tensor-parallel all-reduce's order of magnitude


def _profile(tmp_path: Path, capture: str) -> Path:
    return profiles.profile_from_capture(profiles.capture(capture)).write(tmp_path / "p")


@pytest.mark.parametrize("release", [library.PYNVML_FLOOR, library.PYNVML_NEWEST])
def test_the_nvlink_counters_follow_the_traffic(tmp_path: Path, release: str) -> None:
    knobs = {"SET": f"gpu.0.nvlink.tx_bytes_per_s={RATE:.0f};gpu.0.nvlink.rx_bytes_per_s=0"}
    env = library.environment(_profile(tmp_path, "nvidia-h200__590"), pynvml=release, knobs=knobs)
    with exporter(env) as url:
        first = wait_for(url, lambda t: value(t, TX) is not None)
        time.sleep(1.0)  # timed: about a second of traffic
        second = wait_for(url, lambda t: (value(t, TX) or 0) > (value(first, TX) or 0))
    assert value(first, LINKS) == 18
    assert value(second, RX) == 0
    sent = (value(second, TX) or 0) - (value(first, TX) or 0)
    assert 0.5 * RATE < sent < 3 * RATE  # about a second of traffic, in bytes (not KiB)


@pytest.mark.parametrize("capture", ["nvidia-l40s__595", "nvidia-h200-mig__590"])
def test_no_nvlink_or_mig_mode_serves_none(tmp_path: Path, capture: str) -> None:
    env = library.environment(_profile(tmp_path, capture))
    with exporter(env) as url:
        text = wait_for(url, lambda t: "gpuscope_gpu_up{" in t)
    assert [line for line in text.splitlines() if line.startswith("gpuscope_gpu_nvlink_")] == []
