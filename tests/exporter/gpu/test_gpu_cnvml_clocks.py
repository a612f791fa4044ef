"""Locked clocks on the C fake NVML: the application clock target where the driver keeps
one (R590 answers deprecated, as the captures show), and how often the SM clock changed,
which is 0 for a locked clock and grows for one that swings under load."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_gpu_cnvml_defects import value, wait_for
from test_gpu_cnvml_exporter import exporter

from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

GPU = 'gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000"'
CHANGES = f"gpuscope_gpu_sm_clock_changes_total{{{GPU}}}"
TARGET = f"gpuscope_gpu_sm_clock_target_hertz{{{GPU}}}"
RELEASES = [library.PYNVML_FLOOR, library.PYNVML_NEWEST]


def _environment(tmp_path: Path, release: str, **knobs: str) -> dict[str, str]:
    profile = profiles.profile_from_capture(profiles.capture("nvidia-h200__590"))
    return library.environment(profile.write(tmp_path / "h200"), pynvml=release, knobs=knobs)


@pytest.mark.parametrize("release", RELEASES)
def test_a_swinging_clock_counts_its_changes_and_a_steady_one_none(
    tmp_path: Path, release: str
) -> None:
    swinging = _environment(
        tmp_path, release, SET="gpu.0.clock.sm_mhz_cycle=1980,1410;gpu.0.clock.sm_mhz_cycle_s=0.3"
    )
    with exporter(swinging) as url:
        text = wait_for(url, lambda t: (value(t, CHANGES) or 0) >= 3)
    assert value(text, f"gpuscope_gpu_sm_clock_hertz{{{GPU}}}") in (1.98e9, 1.41e9)
    with exporter(_environment(tmp_path, release)) as url:
        text = wait_for(url, lambda t: value(t, CHANGES) is not None)
        time.sleep(1.0)  # timed: five polls at 0.2 s, in which the clock must not change
        text = wait_for(url, lambda t: value(t, CHANGES) is not None)
    assert value(text, CHANGES) == 0


@pytest.mark.parametrize("release", RELEASES)
def test_the_application_clock_target_where_the_driver_keeps_one(
    tmp_path: Path, release: str
) -> None:
    # as after nvidia-smi -ac on a driver that still has applications clocks
    env = _environment(
        tmp_path, release, SET="gpu.0.clock.applications=set;gpu.0.clock.applications_mhz=1755"
    )
    with exporter(env) as url:
        text = wait_for(url, lambda t: value(t, TARGET) is not None)
    assert value(text, TARGET) == 1.755e9


def test_r590_answers_deprecated_and_doctor_says_so(tmp_path: Path) -> None:
    env = _environment(tmp_path, library.PYNVML_NEWEST)
    done = subprocess.run(
        [sys.executable, "-m", "gpuscope.cli", "doctor", "--gpu-source", "nvml", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (gpu,) = json.loads(done.stdout)["gpus"]
    target = gpu["metrics"]["sm_clock_target"]
    assert not target["supported"] and "deprecated" in target["why"].lower()
