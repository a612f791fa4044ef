"""Issue 25's defects as scenarios of the C fake NVML under the real pynvml and a real
exporter process: each failed on the code before its fix (a hung call served as live
data, one lost GPU silencing every GPU's XIDs, a garbled process list trusted, one bad
handle disabling NVML, a version mismatch retried forever, GPM NaN served as 0)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from test_gpu_cnvml_exporter import _get, exporter

from support.cnvml import library, profiles

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes

UUID0, UUID1 = (
    "GPU-00000000-0000-0000-0000-000000000000",
    "GPU-11111111-1111-1111-1111-111111111111",
)


def two_h200s(tmp_path: Path) -> Path:
    """The H200 capture's GPU twice (GPU 1 with its own UUID and bus id)."""
    profile = profiles.profile_from_capture(profiles.capture("nvidia-h200__590"))
    text = profile.text().replace("device_count=1", "device_count=2")
    second = [
        line.replace("gpu.0.", "gpu.1.", 1)
        .replace(UUID0, UUID1)
        .replace("00000000:83:00.0", "00000000:84:00.0")
        for line in text.splitlines()
        if line.startswith("gpu.0.")
    ]
    path = tmp_path / "two-h200.profile"
    path.write_text(text + "\n".join(second) + "\n")
    return path


def value(metrics: str, series: str) -> float | None:
    match = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.M)
    return None if match is None else float(match.group(1))


def wait_for(url: str, condition: object, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = _get(f"{url}/metrics")[1]
        if condition(text):  # type: ignore[operator]
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s:\n{text}")
        time.sleep(0.1)


def up(uuid: str, gpu: int) -> str:
    return f'gpuscope_gpu_up{{gpu="{gpu}",uuid="{uuid}"}}'


def test_a_hung_call_is_not_served_as_live_data(tmp_path: Path) -> None:
    env = library.environment(
        two_h200s(tmp_path), knobs={"HANG": "nvmlDeviceGetPowerUsage:after_s=1.5:for_s=20"}
    )
    with exporter(env) as url:
        wait_for(url, lambda t: value(t, up(UUID0, 0)) == 1)
        text = wait_for(url, lambda t: value(t, up(UUID0, 0)) == 0, timeout_s=6)
        assert value(text, 'gpuscope_collector_success{collector="nvml"}') == 0
        first_age = value(text, "gpuscope_gpu_sample_age_seconds")
        assert first_age is not None
        # the age keeps growing: the hung call's reading is not served as a fresh one
        wait_for(url, lambda t: (value(t, "gpuscope_gpu_sample_age_seconds") or 0) > first_age)
        assert _get(f"{url}/readyz")[0] == 503


def test_one_lost_gpu_leaves_the_others_xids_counted(tmp_path: Path) -> None:
    env = library.environment(
        two_h200s(tmp_path), knobs={"LOST": "1:after_s=0.5", "XIDS": "0:79:at_s=2.0"}
    )
    with exporter(env) as url:
        text = wait_for(
            url,
            lambda t: (
                value(t, up(UUID1, 1)) == 0
                and value(t, f'gpuscope_gpu_xid_events_total{{gpu="0",uuid="{UUID0}"}}') == 1
            ),
        )
        assert value(text, up(UUID0, 0)) == 1


def test_a_garbled_process_list_is_not_trusted(tmp_path: Path) -> None:
    # one GPU: the join's status is the host's, and a second GPU's clean list would read ok
    one = profiles.profile_from_capture(profiles.capture("nvidia-h200__590")).write(
        tmp_path / "h200"
    )
    env = library.environment(
        one,
        knobs={"PROCESS_STRIDE": "32", "SET": "gpu.0.processes.compute=301:1048576 302:2097152"},
    )
    with exporter(env) as url:
        wait_for(
            url,
            lambda t: value(t, 'gpuscope_gpu_process_join_status{status="untrusted_listing"}') == 1,
        )


def test_one_bad_handle_costs_that_gpu_only(tmp_path: Path) -> None:
    env = library.environment(two_h200s(tmp_path), knobs={"BAD_HANDLE": "1:INSUFFICIENT_POWER"})
    with exporter(env) as url:
        text = wait_for(url, lambda t: value(t, up(UUID0, 0)) == 1)
        assert UUID1 not in text  # never opened: not served as a GPU


def test_a_library_and_driver_mismatch_fails_liveness(tmp_path: Path) -> None:
    env = library.environment(two_h200s(tmp_path), knobs={"RM_MISMATCH": "1.0"})
    with exporter(env) as url:
        deadline = time.monotonic() + 8
        while _get(f"{url}/healthz")[0] != 503:
            assert time.monotonic() < deadline, "liveness never failed after the mismatch"
            time.sleep(0.1)


@pytest.mark.parametrize("nan", ["0", "1"])
def test_gpm_nan_is_left_out_not_zero(tmp_path: Path, nan: str) -> None:
    env = library.environment(two_h200s(tmp_path), knobs={"GPM_NAN": nan})
    with exporter(env) as url:
        time.sleep(0.8)  # timed: poll rounds for GPM's two samples (NaN shows none)
        text = wait_for(url, lambda t: value(t, up(UUID0, 0)) == 1)
    occupancy = value(text, f'gpuscope_gpu_sm_occupancy_ratio{{gpu="0",uuid="{UUID0}"}}')
    assert (occupancy is None) if nan == "1" else (occupancy == 0.0)
